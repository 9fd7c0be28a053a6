//! Service config → the policy table and throttle of the layers.

use super::{ConfigPolicy, MethodConfig, ServiceConfig};
use crate::backoff::{Exponential, Jitter};
use crate::classify::GrpcCodes;
use crate::policy::{
    HedgePolicy, HedgePolicyBuilder, MethodPolicy, Policies, PoliciesBuilder, RetryPolicy,
    RetryPolicyBuilder,
};

/// How [`ServiceConfig::policies_builder_with`] makes the layers' policies from a service
/// config: the backoff jitter of retry policies, and (feature `retry-info`) whether every
/// retry and hedging policy reads `google.rpc.RetryInfo` as pushback.
///
/// The default is what [`ServiceConfig::policies`] uses: today's gRPC jitter
/// ([`Jitter::GRPC`]), and no `RetryInfo`. A [`Jitter`] converts into options with that
/// jitter, so `policies_builder_with(Jitter::Full)` reads as it always has.
///
/// ```
/// use tower_retry_hedge::backoff::Jitter;
/// use tower_retry_hedge::config::PolicyOptions;
///
/// assert_eq!(PolicyOptions::default(), PolicyOptions::new());
/// assert_eq!(PolicyOptions::from(Jitter::Full), PolicyOptions::new().jitter(Jitter::Full));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyOptions {
    jitter: Jitter,
    #[cfg(feature = "retry-info")]
    retry_info: bool,
}

impl Default for PolicyOptions {
    fn default() -> PolicyOptions {
        PolicyOptions::new()
    }
}

impl From<Jitter> for PolicyOptions {
    fn from(jitter: Jitter) -> PolicyOptions {
        PolicyOptions::new().jitter(jitter)
    }
}

impl PolicyOptions {
    /// The defaults: [`Jitter::GRPC`], and no `RetryInfo`.
    pub const fn new() -> PolicyOptions {
        PolicyOptions {
            jitter: Jitter::GRPC,
            #[cfg(feature = "retry-info")]
            retry_info: false,
        }
    }

    /// The jitter of every retry policy's backoff (default [`Jitter::GRPC`], ±20 % as
    /// grpc-go, grpc-java and C-core apply it; [`Jitter::Full`] is the 2017 text of A6).
    ///
    /// # Panics
    ///
    /// If the jitter is a `Proportional` whose fraction is NaN or outside `[0, 1]`, which no
    /// backoff takes ([`Jitter::proportional`] checks one): a bug in the caller, reported where
    /// it is, not by policies that would silently be left out.
    pub const fn jitter(mut self, jitter: Jitter) -> PolicyOptions {
        if let Jitter::Proportional(fraction) = jitter {
            assert!(
                fraction >= 0.0 && fraction <= 1.0,
                "PolicyOptions::jitter: a Proportional jitter's fraction must be in [0, 1]"
            );
        }
        self.jitter = jitter;
        self
    }

    /// Whether every retry and hedging policy made from the config reads
    /// `google.rpc.RetryInfo` from `grpc-status-details-bin` as pushback, as a policy built
    /// in code with
    /// [`GrpcCodes::with_retry_info`](crate::classify::GrpcCodes::with_retry_info) does
    /// (default `false`): a retryable (or, for hedging, non-fatal) status that carries a
    /// `RetryInfo` delay is retried (or the next hedge sent) after exactly that delay,
    /// under the same cap as `grpc-retry-pushback-ms`
    /// ([`max_pushback`](crate::policy::PoliciesBuilder::max_pushback)), which wins when a
    /// response carries both. Google APIs send their retry delay this way.
    ///
    /// ```
    /// use tower_retry_hedge::config::{PolicyOptions, ServiceConfig};
    ///
    /// let config = ServiceConfig::from_json(r#"{"methodConfig": [{
    ///     "name": [{"service": "google.pubsub.v1.Publisher"}],
    ///     "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "60s",
    ///                     "backoffMultiplier": 1.3, "retryableStatusCodes": ["UNAVAILABLE"]}
    /// }]}"#)?;
    /// let policies = config
    ///     .policies_builder_with(PolicyOptions::new().retry_info(true))
    ///     .build();
    /// # let _ = policies;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "retry-info")]
    #[cfg_attr(docsrs, doc(cfg(feature = "retry-info")))]
    pub const fn retry_info(mut self, enabled: bool) -> PolicyOptions {
        self.retry_info = enabled;
        self
    }

    /// `builder`, retrying `codes` (and reading `RetryInfo` if asked).
    fn retryable(self, builder: RetryPolicyBuilder, codes: GrpcCodes) -> RetryPolicyBuilder {
        #[cfg(feature = "retry-info")]
        if self.retry_info {
            return builder.retryable(codes.with_retry_info());
        }
        builder.retryable(codes)
    }

    /// `builder`, with `codes` non-fatal (and reading `RetryInfo` if asked).
    fn non_fatal(self, builder: HedgePolicyBuilder, codes: GrpcCodes) -> HedgePolicyBuilder {
        #[cfg(feature = "retry-info")]
        if self.retry_info {
            return builder.non_fatal(codes.with_retry_info());
        }
        builder.non_fatal(codes)
    }
}

impl ServiceConfig {
    /// The policy table this config describes, ready for
    /// [`RetryLayer`](crate::RetryLayer) and [`HedgeLayer`](crate::HedgeLayer): one line for
    /// the common case.
    ///
    /// Backoff jitter is today's gRPC behaviour (±20 % after the cap, as grpc-go, grpc-java
    /// and C-core do), so the same JSON behaves as it does there; see
    /// [`policies_builder_with`](ServiceConfig::policies_builder_with) for the full jitter of
    /// the 2017 A6 text, `RetryInfo` as pushback, or to set buffer limits or the client cap.
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
        self.policies_builder_with(PolicyOptions::new()).build()
    }

    /// A builder of the policy table, made with these options (a [`Jitter`], or
    /// [`PolicyOptions`] for `RetryInfo` as pushback), to which buffer limits, the client
    /// cap on `maxAttempts` or a different throttle can be added.
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
    pub fn policies_builder_with(&self, options: impl Into<PolicyOptions>) -> PoliciesBuilder {
        let options = options.into();
        let mut builder = Policies::builder();
        for method_config in self.method_configs() {
            // A config without a retry or hedging policy still matches its names, and so
            // turns off what a broader name would have given them, as gRPC's lookup does.
            let policy = method_policy(method_config, options);
            for name in &method_config.names {
                builder = match (name.method.as_deref(), &policy) {
                    (Some(method), Some(policy)) => {
                        builder.method(&format!("{}/{method}", name.service), policy.clone())
                    }
                    (Some(method), None) => {
                        builder.method_without_policy(&format!("{}/{method}", name.service))
                    }
                    (None, Some(policy)) if name.service.is_empty() => {
                        builder.default_policy(policy.clone())
                    }
                    (None, None) if name.service.is_empty() => builder,
                    (None, Some(policy)) => builder.service(&name.service, policy.clone()),
                    (None, None) => builder.service_without_policy(&name.service),
                };
            }
        }
        if let Some(throttle) = self.throttle() {
            builder = builder.throttle(throttle);
        }
        builder
    }
}

/// Why the policies of a parsed config build: the parse refused every value the backoff and
/// the policy builders refuse (`maxAttempts` < 2, backoffs and `perAttemptRecvTimeout` of
/// zero, a multiplier that is not a finite number > 0), a hedging delay is always given, and
/// [`PolicyOptions::jitter`] refuses a jitter the backoff would. An error here is a bug
/// between the parse and the builders: it panics, naming that invariant, rather than drop the
/// method's policy in silence (its calls would no longer be retried, and nothing would say
/// why; a `debug_assert!` would still drop it in release builds, where it matters). The
/// property tests build every generated config.
const BUILT_ONCE_VALIDATED: &str =
    "a validated service config builds its policies: the parse checks what the builders check";

/// The layer policy of one method config; a `timeout` alone gives its methods that deadline;
/// `None` when it has neither a policy nor a timeout.
fn method_policy(config: &MethodConfig, options: PolicyOptions) -> Option<MethodPolicy> {
    let wait_for_ready = config.wait_for_ready == Some(true);
    let Some(policy) = config.policy else {
        if wait_for_ready {
            return Some(MethodPolicy::WaitForReady(config.timeout));
        }
        return config.timeout.map(MethodPolicy::Timeout);
    };
    let policy = match policy {
        ConfigPolicy::Retry(retry) => {
            // A6 allows maxBackoff below initialBackoff: `a6` keeps the formula exact.
            let backoff = Exponential::a6(
                retry.initial_backoff,
                retry.max_backoff,
                retry.backoff_multiplier,
                options.jitter,
            )
            .expect(BUILT_ONCE_VALIDATED);
            let builder = RetryPolicy::builder()
                .max_attempts(retry.max_attempts)
                .backoff(backoff)
                .wait_for_ready(wait_for_ready);
            let mut builder = options.retryable(builder, retry.retryable_status_codes);
            if let Some(timeout) = config.timeout {
                builder = builder.timeout(timeout);
            }
            if let Some(timeout) = retry.per_attempt_recv_timeout {
                builder = builder.per_attempt_timeout(timeout);
            }
            MethodPolicy::from(builder.build().expect(BUILT_ONCE_VALIDATED))
        }
        ConfigPolicy::Hedging(hedging) => {
            // Beyond A6, as for a policy built in code: the default budget on the extra load
            // of hedges (see `HedgeBudget`), which `PoliciesBuilder::hedge_budget` changes or
            // turns off, and the record of the backends tried.
            let builder = HedgePolicy::builder()
                .max_attempts(hedging.max_attempts)
                .delay(hedging.hedging_delay)
                .wait_for_ready(wait_for_ready);
            let mut builder = options.non_fatal(builder, hedging.non_fatal_status_codes);
            if let Some(timeout) = config.timeout {
                builder = builder.timeout(timeout);
            }
            MethodPolicy::from(builder.build().expect(BUILT_ONCE_VALIDATED))
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

    /// A jitter no backoff takes is the caller's bug, reported where it is made, not by
    /// policies silently left out of the table.
    #[test]
    #[should_panic(expected = "a Proportional jitter's fraction must be in [0, 1]")]
    fn a_jitter_no_backoff_takes_is_refused() {
        let _ = PolicyOptions::from(Jitter::Proportional(1.5));
    }

    #[test]
    #[should_panic(expected = "a Proportional jitter's fraction must be in [0, 1]")]
    fn a_nan_jitter_is_refused() {
        let _ = PolicyOptions::new().jitter(Jitter::Proportional(f64::NAN));
    }

    #[test]
    fn a_jitter_is_options() {
        let config = ServiceConfig::from_json(A6).unwrap();
        let Some(MethodPolicy::Retry(none)) = lookup(
            &config.policies_builder_with(Jitter::None).build(),
            "/x.Y/Z",
        ) else {
            panic!("default policy expected");
        };
        // min(2 s × 1.5^n, 1 s), unjittered.
        assert_eq!(none.backoff().delay(0), Duration::from_secs(1));
    }

    /// With `retry_info`, every retry and hedging policy made from the JSON reads
    /// `RetryInfo`; without it, none does.
    #[cfg(feature = "retry-info")]
    #[test]
    fn retry_info_reaches_every_policy_from_json() {
        use crate::classify::{AttemptResult, Classify, Outcome};
        use crate::pushback::Pushback;
        use http::{HeaderMap, HeaderValue, StatusCode};

        // google.rpc.Status { code: 14, details: [RetryInfo { retry_delay: 0.3 s }] }
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("14"));
        headers.insert(
            "grpc-status-details-bin",
            HeaderValue::from_static(
                "CA4aNAoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIICgYQgMaGjwE",
            ),
        );
        let answer = AttemptResult::Response {
            status: StatusCode::OK,
            headers: &headers,
        };
        let classify = |policy: &MethodPolicy| match policy {
            MethodPolicy::Retry(retry) => retry.classifier().classify(answer),
            MethodPolicy::Hedge(hedge) => hedge.classifier.classify(answer),
            _ => panic!("a retry or hedging policy expected"),
        };
        let config = ServiceConfig::from_json(A6).unwrap();
        let with = config
            .policies_builder_with(PolicyOptions::new().retry_info(true))
            .build();
        let without = config.policies();
        for path in [
            "/pkg.Retried/A",
            "/pkg.Other/Get",
            "/pkg.Hedged/A",
            "/x.Y/Z",
        ] {
            let policy = lookup(&with, path).expect("a policy");
            let expected = if path == "/x.Y/Z" {
                // The default retries ABORTED only: UNAVAILABLE is fatal, RetryInfo or not.
                Outcome::Fatal(None)
            } else {
                Outcome::Retryable(Some(Pushback::After(Duration::from_millis(300))))
            };
            assert_eq!(classify(&policy), expected, "{path}");
            let policy = lookup(&without, path).expect("a policy");
            let plain = if path == "/x.Y/Z" {
                Outcome::Fatal(None)
            } else {
                Outcome::Retryable(None)
            };
            assert_eq!(classify(&policy), plain, "{path}");
        }
    }

    #[test]
    fn wait_for_ready_and_the_hedge_budget_reach_the_policies() {
        let config = ServiceConfig::from_json(
            r#"{"methodConfig": [
              {"name": [{"service": "pkg.Waiting"}], "waitForReady": true, "timeout": "2s"},
              {"name": [{"service": "pkg.Retried"}], "waitForReady": true,
               "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.1s", "maxBackoff": "1s",
                               "backoffMultiplier": 2, "retryableStatusCodes": [14]}},
              {"name": [{"service": "pkg.Hedged"}],
               "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.01s"}}
            ]}"#,
        )
        .unwrap();
        let policies = config.policies();
        let lookup = |path| policies.lookup(&Method::POST, path);
        assert!(matches!(
            lookup("/pkg.Waiting/M"),
            Some(MethodPolicy::WaitForReady(Some(t))) if *t == Duration::from_secs(2)
        ));
        assert!(
            matches!(lookup("/pkg.Retried/M"), Some(MethodPolicy::Retry(p)) if p.wait_for_ready)
        );
        let Some(MethodPolicy::Hedge(hedge)) = lookup("/pkg.Hedged/M") else {
            panic!("a hedging policy")
        };
        assert!(
            !hedge.wait_for_ready && hedge.budget.is_some(),
            "the default budget"
        );
        // The table's switch turns it off.
        let policies = config
            .policies_builder_with(Jitter::GRPC)
            .hedge_budget(None)
            .build();
        let Some(MethodPolicy::Hedge(hedge)) = policies.lookup(&Method::POST, "/pkg.Hedged/M")
        else {
            panic!("a hedging policy")
        };
        assert!(hedge.budget.is_none());
    }
}
