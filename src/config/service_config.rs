//! [`ServiceConfig`]: the validated document, its lookups, and its serde form.

use std::str::FromStr;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::index::{NameIndex, Slot};
use super::{ConfigError, IgnoredKey, MethodConfig, RetryThrottling, parse, unknown};
use crate::grpc_path;
use crate::throttle::Throttle;

/// A validated gRPC service config: its method configs and its retry throttling, ready to
/// become the layers' [`Policies`](crate::Policies).
///
/// Build it with [`ServiceConfig::from_json`] (or `str::parse`, or serde); turn it into the
/// policy table with [`ServiceConfig::policies`], whose
/// [`lookup`](crate::Policies::lookup) gives each method's [`RetryPolicy`](crate::RetryPolicy)
/// or [`HedgePolicy`](crate::HedgePolicy) and its timeout. There is one policy model: the
/// config has no public types of its own beyond its error and its ignored keys. The default
/// value is the empty config (`{}`).
///
/// Keys gRPC does not define are ignored, as gRPC ignores them, but not silently: the parse
/// logs them in one `WARN` event and [`ServiceConfig::ignored`] lists them, with a "did you
/// mean" for near misses; [`ServiceConfig::from_json_strict`] refuses them. Equality
/// compares the configuration only, not the keys its document had that were ignored.
///
/// ```
/// use tower_retry_hedge::config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{"loadBalancingPolicy": "round_robin"}"#)?;
/// assert!(config.throttle().is_none());
/// assert_eq!(config, ServiceConfig::default());
/// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ServiceConfig {
    pub(super) method_configs: Vec<MethodConfig>,
    pub(super) retry_throttling: Option<RetryThrottling>,
    pub(super) index: NameIndex,
    pub(super) ignored: Vec<IgnoredKey>,
    pub(super) ignored_count: usize,
}

/// The configuration, not the keys its document had that were ignored.
impl PartialEq for ServiceConfig {
    fn eq(&self, other: &ServiceConfig) -> bool {
        self.method_configs == other.method_configs
            && self.retry_throttling == other.retry_throttling
            && self.index == other.index
    }
}

impl ServiceConfig {
    /// Parses and validates service-config JSON.
    ///
    /// Documents longer than 1 MiB are refused before parsing. Keys gRPC
    /// does not define are ignored, logged in one `WARN` event (target
    /// `tower_retry_hedge::config::unknown`), and listed by [`ServiceConfig::ignored`].
    pub fn from_json(json: &str) -> Result<ServiceConfig, ConfigError> {
        ServiceConfig::parse_json(json, false)
    }

    /// Parses and validates service-config JSON, refusing keys gRPC does not define: the
    /// error names the key's path and the field it is a near miss of, if any
    /// ([`Rule::UnknownField`](super::Rule::UnknownField)). Fields gRPC defines that this
    /// crate does not use (`loadBalancingConfig`, `healthCheckConfig`, `waitForReady`, ...)
    /// are accepted, and the contents of `loadBalancingConfig` (each policy's own
    /// configuration) are not checked.
    ///
    /// Keys are checked object by object as the document is read: the unknown keys of an
    /// object are reported before the other errors of that object.
    ///
    /// ```
    /// use tower_retry_hedge::config::{Rule, ServiceConfig};
    ///
    /// let json = r#"{"methodConfig": [{"name": [{"service": "pkg.Search"}],
    ///     "hedgingPolicy": {"maxAttempts": 3, "hedgeDelay": "0.05s"}}]}"#;
    /// assert!(ServiceConfig::from_json(json).is_ok());
    ///
    /// let err = ServiceConfig::from_json_strict(json).unwrap_err();
    /// assert_eq!(err.path(), "methodConfig[0].hedgingPolicy.hedgeDelay");
    /// assert_eq!(err.rule(), &Rule::UnknownField { suggestion: Some("hedgingDelay") });
    /// assert_eq!(
    ///     err.to_string(),
    ///     "methodConfig[0].hedgingPolicy.hedgeDelay: is not a field of gRPC's service \
    ///      config (did you mean hedgingDelay?)"
    /// );
    /// ```
    pub fn from_json_strict(json: &str) -> Result<ServiceConfig, ConfigError> {
        ServiceConfig::parse_json(json, true)
    }

    /// Validates a service config already parsed as JSON (the entry limits apply; the
    /// size limit cannot, the document being already in memory). Keys gRPC does not
    /// define are ignored and reported as by [`ServiceConfig::from_json`].
    pub fn from_value(value: &Value) -> Result<ServiceConfig, ConfigError> {
        let config = parse::parse_service_config(value, false)?;
        unknown::warn(&config.ignored, config.ignored_count);
        Ok(config)
    }

    /// [`ServiceConfig::from_value`], refusing keys gRPC does not define as
    /// [`ServiceConfig::from_json_strict`] does.
    pub fn from_value_strict(value: &Value) -> Result<ServiceConfig, ConfigError> {
        parse::parse_service_config(value, true)
    }

    fn parse_json(json: &str, strict: bool) -> Result<ServiceConfig, ConfigError> {
        let value = parse::document(json)?;
        if strict {
            ServiceConfig::from_value_strict(&value)
        } else {
            ServiceConfig::from_value(&value)
        }
    }

    /// The keys of the document that gRPC does not define, which the parse ignored, in the
    /// order they were read (object by object; the keys of one object in sorted order): at
    /// most the first 100; see
    /// [`ignored_count`](ServiceConfig::ignored_count) for them all. Empty for a config
    /// parsed strictly or built by `Default`.
    ///
    /// A key is unknown when gRPC's service config does not define it in that place. Keys
    /// gRPC defines are never listed, even those this crate does not use: `loadBalancingPolicy`,
    /// `loadBalancingConfig` (whose contents are each load balancer's own and are not
    /// looked into), `healthCheckConfig.serviceName`,
    /// `connectionScaling.maxConnectionsPerSubchannel`, a method config's `waitForReady`,
    /// `timeout`, `maxRequestMessageBytes` and `maxResponseMessageBytes`. A retry policy's
    /// `perAttemptRecvTimeout` (read by grpc-java and C-core) is read and applied. Only the
    /// proto3 JSON names are defined (`maxAttempts`, not `max_attempts` nor `MaxAttempts`,
    /// which grpc-go's case-insensitive decoding would also take): those are listed, with the
    /// field they stand for as the suggestion, as the crate does not read them.
    ///
    /// ```
    /// use tower_retry_hedge::config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{
    ///   "loadBalancingConfig": [{"round_robin": {}}],
    ///   "methodConfig": [{
    ///     "name": [{"service": "pkg.Search", "methdo": "Query"}],
    ///     "waitForReady": true,
    ///     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
    ///                     "comment": "retries for search"}
    ///   }],
    ///   "retryThrotling": {"maxTokens": 10, "tokenRatio": 0.1}
    /// }"#)?;
    /// let ignored: Vec<String> = config.ignored().iter().map(|key| key.to_string()).collect();
    /// assert_eq!(ignored, [
    ///     "retryThrotling (did you mean retryThrottling?)",
    ///     "methodConfig[0].name[0].methdo (did you mean method?)",
    ///     "methodConfig[0].retryPolicy.comment",
    /// ]);
    /// // The misspelt "retryThrottling" means no throttle, and "methdo" the whole service.
    /// assert!(config.throttle().is_none());
    /// let policies = config.policies();
    /// assert!(policies.lookup(&http::Method::POST, "/pkg.Search/Other").is_some());
    /// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
    /// ```
    pub fn ignored(&self) -> &[IgnoredKey] {
        &self.ignored
    }

    /// How many keys gRPC does not define the document had, which can be more than
    /// [`ignored`](ServiceConfig::ignored) lists.
    pub fn ignored_count(&self) -> usize {
        self.ignored_count
    }

    /// A new A6 retry throttle as `retryThrottling` describes it, if the config has one:
    /// what [`policies`](ServiceConfig::policies) gives the layers. Make it here to read its
    /// state while calls run, or to share one throttle between several policy tables.
    ///
    /// ```
    /// use tower_retry_hedge::backoff::Jitter;
    /// use tower_retry_hedge::config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(
    ///     r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#,
    /// )?;
    /// let throttle = config.throttle().expect("configured");
    /// assert_eq!(throttle.max_tokens(), 10);
    /// let policies = config.policies_builder_with(Jitter::GRPC).throttle(throttle.clone()).build();
    /// # let _ = policies;
    /// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
    /// ```
    pub fn throttle(&self) -> Option<Throttle> {
        let throttling = self.retry_throttling?;
        // The parse checked what `new` checks (`maxTokens` in 1..=1000, a ratio of at least
        // 0.001): an error is a bug between the two, to see rather than a throttle left out.
        let throttle = Throttle::new(throttling.max_tokens, throttling.token_ratio());
        Some(throttle.expect("a validated retry throttling makes a throttle"))
    }

    /// `maxRequestMessageBytes` of the method config that applies to a gRPC request path
    /// (`/package.Service/Method`), for the client's encoder; gRFC A6 does not use it.
    pub fn max_request_message_bytes(&self, path: &str) -> Option<u64> {
        self.lookup_path(path)?.max_request_message_bytes
    }

    /// `maxResponseMessageBytes` of the method config that applies to a gRPC request path,
    /// for the client's decoder; gRFC A6 does not use it.
    pub fn max_response_message_bytes(&self, path: &str) -> Option<u64> {
        self.lookup_path(path)?.max_response_message_bytes
    }

    /// The method configs, in document order.
    pub(crate) fn method_configs(&self) -> &[MethodConfig] {
        &self.method_configs
    }

    /// The retry throttling, if configured.
    #[cfg(test)]
    pub(crate) fn retry_throttling(&self) -> Option<RetryThrottling> {
        self.retry_throttling
    }

    /// The method config of the default name (`{}`), if any.
    pub(crate) fn default_method_config(&self) -> Option<&MethodConfig> {
        self.at(self.index.find_default())
    }

    /// The method config that applies to `method` of `service` (such as
    /// `"helloworld.Greeter"`, `"SayHello"`): the one naming that exact method, else
    /// the one naming the whole service, else the default, else none.
    ///
    /// The most specific config applies whole: a method config without a policy that
    /// names the method turns off the retry policy its service or the default has.
    pub(crate) fn method_config(&self, service: &str, method: &str) -> Option<&MethodConfig> {
        self.at(self.index.find(service, method))
    }

    /// The method config for a gRPC request path, `/package.Service/Method`, as
    /// [`ServiceConfig::method_config`] finds it.
    ///
    /// A path that is not of that form (no leading `/`, no second `/`, an empty
    /// service or method, or a third `/`) can match no name, so it gets the default
    /// config (or none), as in grpc-go.
    pub(crate) fn lookup_path(&self, path: &str) -> Option<&MethodConfig> {
        match grpc_path::split(path) {
            Some((service, method)) => self.method_config(service, method),
            None => self.default_method_config(),
        }
    }

    /// The config as service-config JSON, which [`ServiceConfig::from_json`] parses back to
    /// an equal value: the property tests' way back.
    #[cfg(test)]
    pub(crate) fn to_json(&self) -> String {
        super::table::write(super::objects::ROOT, self).to_string()
    }

    fn at(&self, slot: Option<Slot>) -> Option<&MethodConfig> {
        slot.and_then(|slot| self.method_configs.get(slot.config))
    }
}

impl FromStr for ServiceConfig {
    type Err = ConfigError;

    fn from_str(json: &str) -> Result<ServiceConfig, ConfigError> {
        ServiceConfig::from_json(json)
    }
}

/// Deserializes and validates, for a service config embedded in a larger document.
/// The size of that document is the caller's to bound.
impl<'de> Deserialize<'de> for ServiceConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ServiceConfig, D::Error> {
        let value = Value::deserialize(deserializer)?;
        ServiceConfig::from_value(&value).map_err(serde::de::Error::custom)
    }
}
