//! [`ServiceConfig`]: the validated document, its lookups, and its JSON and serde forms.

use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::index::{NameIndex, Slot};
use super::{ConfigError, MAX_DOCUMENT_BYTES, MethodConfig, RetryThrottling, parse, write};
use crate::grpc_path;

/// A validated gRPC service config: its method configs and its retry throttling.
///
/// Build it with [`ServiceConfig::from_json`] (or `str::parse`, or serde); find the
/// config of a call with [`ServiceConfig::lookup_path`] or
/// [`ServiceConfig::method_config`]. [`ServiceConfig::to_json`] writes it back as
/// service-config JSON that parses to an equal value. The default value is the empty
/// config (`{}`).
///
/// ```
/// use tower_retry_hedge::config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{"loadBalancingPolicy": "round_robin"}"#)?;
/// assert!(config.method_configs().is_empty());
/// assert!(config.retry_throttling().is_none());
/// assert_eq!(config, ServiceConfig::default());
/// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceConfig {
    pub(super) method_configs: Vec<MethodConfig>,
    pub(super) retry_throttling: Option<RetryThrottling>,
    pub(super) index: NameIndex,
}

impl ServiceConfig {
    /// Parses and validates service-config JSON.
    ///
    /// Documents longer than [`MAX_DOCUMENT_BYTES`] are refused before parsing.
    pub fn from_json(json: &str) -> Result<ServiceConfig, ConfigError> {
        if json.len() > MAX_DOCUMENT_BYTES {
            return Err(ConfigError::document_too_large(json.len()));
        }
        let value: Value =
            serde_json::from_str(json).map_err(|e| ConfigError::from_json_error(&e))?;
        ServiceConfig::from_value(&value)
    }

    /// Validates a service config already parsed as JSON (the entry limits apply; the
    /// size limit cannot, the document being already in memory).
    pub fn from_value(value: &Value) -> Result<ServiceConfig, ConfigError> {
        parse::parse_service_config(value)
    }

    /// The method configs, in document order.
    pub fn method_configs(&self) -> &[MethodConfig] {
        &self.method_configs
    }

    /// The retry throttling, if configured.
    pub fn retry_throttling(&self) -> Option<RetryThrottling> {
        self.retry_throttling
    }

    /// The method config of the default name (`{}`), if any.
    pub fn default_method_config(&self) -> Option<&MethodConfig> {
        self.at(self.index.find_default())
    }

    /// The method config that applies to `method` of `service` (such as
    /// `"helloworld.Greeter"`, `"SayHello"`): the one naming that exact method, else
    /// the one naming the whole service, else the default, else none.
    ///
    /// The most specific config applies whole: a method config without a policy that
    /// names the method turns off the retry policy its service or the default has.
    ///
    /// ```
    /// use tower_retry_hedge::config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{"methodConfig": [
    ///     {"name": [{"service": "s", "method": "m"}], "timeout": "1s"},
    ///     {"name": [{"service": "s"}], "timeout": "2s"},
    ///     {"name": [{}], "timeout": "3s"}
    /// ]}"#)?;
    /// let timeout = |s, m| config.method_config(s, m).and_then(|c| c.timeout());
    /// assert_eq!(timeout("s", "m").unwrap().as_secs(), 1);
    /// assert_eq!(timeout("s", "other").unwrap().as_secs(), 2);
    /// assert_eq!(timeout("t", "m").unwrap().as_secs(), 3);
    /// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
    /// ```
    pub fn method_config(&self, service: &str, method: &str) -> Option<&MethodConfig> {
        self.at(self.index.find(service, method))
    }

    /// The method config for a gRPC request path, `/package.Service/Method`, as
    /// [`ServiceConfig::method_config`] finds it.
    ///
    /// A path that is not of that form (no leading `/`, no second `/`, an empty
    /// service or method, or a third `/`) can match no name, so it gets the default
    /// config (or none), as in grpc-go.
    pub fn lookup_path(&self, path: &str) -> Option<&MethodConfig> {
        match grpc_path::split(path) {
            Some((service, method)) => self.method_config(service, method),
            None => self.default_method_config(),
        }
    }

    /// The config as a `serde_json::Value` in service-config form.
    pub fn to_value(&self) -> Value {
        write::service_config_value(self)
    }

    /// The config as service-config JSON, which [`ServiceConfig::from_json`] parses
    /// back to an equal value.
    ///
    /// ```
    /// use tower_retry_hedge::config::ServiceConfig;
    ///
    /// let json = r#"{"methodConfig":[{"name":[{"service":"s"}],
    ///     "hedgingPolicy":{"maxAttempts":3,"hedgingDelay":"0.1s"}}]}"#;
    /// let config = ServiceConfig::from_json(json)?;
    /// assert_eq!(ServiceConfig::from_json(&config.to_json())?, config);
    /// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
    /// ```
    pub fn to_json(&self) -> String {
        self.to_value().to_string()
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

impl Serialize for ServiceConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
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
