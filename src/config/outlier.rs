//! Outlier detection from the JSON of gRPC's `outlier_detection_experimental` policy, read
//! with the service config's readers, limits and errors.

use serde_json::Value;

use super::parse::{child, document, field, non_negative_duration, object, positive_duration};
use super::{ConfigError, Rule};
use crate::balance::{FailurePercentageEjection, OutlierDetection, SuccessRateEjection};

/// What an error of the document itself calls it.
const DOCUMENT: &str = "outlier detection config";

/// The name gRPC registers the policy under.
const POLICY_NAME: &str = "outlier_detection_experimental";

impl OutlierDetection {
    /// Settings from the JSON of gRPC's `outlier_detection_experimental` load-balancing
    /// policy: its config object, or an object whose only key is
    /// `outlier_detection_experimental` holding it.
    ///
    /// Fields, as gRFC A50 defines them: `interval`, `baseEjectionTime`, `maxEjectionTime`
    /// (proto3 JSON durations such as `"10s"`), `maxEjectionPercent`, `successRateEjection`
    /// `{stdevFactor, enforcementPercentage, minimumHosts, requestVolume}`,
    /// `failurePercentageEjection` `{threshold, enforcementPercentage, minimumHosts,
    /// requestVolume}` (unsigned 32-bit integers, as numbers or decimal strings). An absent (or
    /// `null`) field takes A50's default, not the balancer's: `interval` 10 s, ejection times
    /// 30 s and 300 s, 10 %, and an algorithm runs only if its object is present. Other keys
    /// (`childPolicy`) are ignored, as gRPC ignores them. A50 has no run of consecutive
    /// failures: it is off ([`to_builder`](Self::to_builder) turns it on); the failure
    /// half-life and codes keep the balancer's defaults.
    ///
    /// The input is untrusted: a document longer than 1 MiB, bad JSON, a wrong type, a
    /// malformed or negative duration, an `interval` of zero, a percentage above 100 or an
    /// integer out of range is a [`ConfigError`] naming the field and the [`Rule`], as a
    /// service config's are.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::balance::OutlierDetection;
    /// use tower_retry_hedge::config::Rule;
    ///
    /// let detection = OutlierDetection::from_json(r#"{"outlier_detection_experimental": {
    ///     "interval": "1s", "baseEjectionTime": "10s", "maxEjectionPercent": 34,
    ///     "failurePercentageEjection": {"threshold": 80, "minimumHosts": 3, "requestVolume": "20"},
    ///     "childPolicy": [{"round_robin": {}}]
    /// }}"#)?;
    /// assert_eq!(detection.interval(), Duration::from_secs(1));
    /// assert_eq!(detection.max_ejection_time(), Duration::from_secs(300));
    /// assert_eq!(detection.failure_percentage().unwrap().request_volume, 20);
    /// assert_eq!(detection.success_rate(), None);
    ///
    /// let error = OutlierDetection::from_json(r#"{"maxEjectionPercent": 101}"#).unwrap_err();
    /// assert_eq!(error.path(), "maxEjectionPercent");
    /// assert_eq!(error.rule(), &Rule::Percent);
    /// assert_eq!(error.to_string(), "maxEjectionPercent: must be at most 100, got 101");
    /// # Ok::<(), tower_retry_hedge::config::ConfigError>(())
    /// ```
    pub fn from_json(json: &str) -> Result<OutlierDetection, ConfigError> {
        read(json).map_err(|error| error.of(DOCUMENT))
    }
}

fn read(json: &str) -> Result<OutlierDetection, ConfigError> {
    let value = document(json)?;
    let root = object(&value, "")?;
    let (object, prefix) = match root.get(POLICY_NAME) {
        Some(inner) if root.len() == 1 => (self::object(inner, POLICY_NAME)?, POLICY_NAME),
        _ => (root, ""),
    };
    let mut config = OutlierDetection::a50_defaults();
    let read = |key| field(object, key).map(|value| (value, child(prefix, key)));
    if let Some((value, path)) = read("interval") {
        config.interval = positive_duration(value, &path)?;
    }
    if let Some((value, path)) = read("baseEjectionTime") {
        config.base_ejection_time = non_negative_duration(value, &path)?;
    }
    if let Some((value, path)) = read("maxEjectionTime") {
        config.max_ejection_time = non_negative_duration(value, &path)?;
    }
    if let Some((value, path)) = read("maxEjectionPercent") {
        config.max_ejection_percent = bounded(value, &path, 100)?;
    }
    // Each algorithm's fields: `uint32`s, percentages at most 100.
    const ANY: u32 = u32::MAX;
    if let Some((value, path)) = read("successRateEjection") {
        let mut ejection = SuccessRateEjection::default();
        read_uint32s(
            self::object(value, &path)?,
            &path,
            [
                ("stdevFactor", &mut ejection.stdev_factor, ANY),
                (
                    "enforcementPercentage",
                    &mut ejection.enforcement_percentage,
                    100,
                ),
                ("minimumHosts", &mut ejection.minimum_hosts, ANY),
                ("requestVolume", &mut ejection.request_volume, ANY),
            ],
        )?;
        config.success_rate = Some(ejection);
    }
    if let Some((value, path)) = read("failurePercentageEjection") {
        let mut ejection = FailurePercentageEjection::default();
        read_uint32s(
            self::object(value, &path)?,
            &path,
            [
                ("threshold", &mut ejection.threshold, 100),
                (
                    "enforcementPercentage",
                    &mut ejection.enforcement_percentage,
                    100,
                ),
                ("minimumHosts", &mut ejection.minimum_hosts, ANY),
                ("requestVolume", &mut ejection.request_volume, ANY),
            ],
        )?;
        config.failure_percentage = Some(ejection);
    }
    Ok(config)
}

/// Reads the fields of `object` (at `path`) that are present into their slots, each at
/// most its bound.
fn read_uint32s(
    object: &serde_json::Map<String, Value>,
    path: &str,
    slots: [(&str, &mut u32, u32); 4],
) -> Result<(), ConfigError> {
    for (key, slot, max) in slots {
        if let Some(value) = field(object, key) {
            *slot = bounded(value, &child(path, key), max)?;
        }
    }
    Ok(())
}

/// A proto3 JSON `uint32`: a number with no fraction, or a string of decimal digits.
fn uint32(value: &Value, path: &str) -> Result<u32, ConfigError> {
    let out_of_range = || ConfigError::got(path, Rule::Uint32, value);
    match value {
        Value::Number(number) => {
            if let Some(n) = number.as_u64() {
                u32::try_from(n).map_err(|_| out_of_range())
            } else if number.is_i64() {
                Err(out_of_range())
            } else {
                // A float: an integer only if it has no fraction (proto3 JSON accepts `1e2`).
                let float = number.as_f64().unwrap_or(f64::NAN);
                if float.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&float) {
                    Ok(float as u32)
                } else {
                    Err(out_of_range())
                }
            }
        }
        Value::String(text) => {
            if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(out_of_range());
            }
            text.parse::<u32>().map_err(|_| out_of_range())
        }
        other => {
            let expected = "an unsigned 32-bit integer";
            Err(ConfigError::got(path, Rule::WrongType { expected }, other))
        }
    }
}

/// A `uint32` of at most `max`: 100 for a percentage.
fn bounded(value: &Value, path: &str, max: u32) -> Result<u32, ConfigError> {
    match uint32(value, path)? {
        n if n > max => Err(ConfigError::got(path, Rule::Percent, value)),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::MAX_DOCUMENT_BYTES;

    fn error(json: &str) -> (String, Rule, String) {
        let error = OutlierDetection::from_json(json).expect_err(json);
        (
            error.path().to_owned(),
            error.rule().clone(),
            error.to_string(),
        )
    }

    #[test]
    fn absent_fields_take_a50s_defaults() {
        let config = OutlierDetection::from_json("{}").unwrap();
        assert_eq!(config.interval(), Duration::from_secs(10));
        assert_eq!(config.base_ejection_time(), Duration::from_secs(30));
        assert_eq!(config.max_ejection_time(), Duration::from_secs(300));
        assert_eq!(config.max_ejection_percent(), 10);
        assert_eq!(config.success_rate(), None);
        assert_eq!(config.failure_percentage(), None);
        assert_eq!(config.consecutive_failures(), None);
        let config = OutlierDetection::from_json(
            r#"{"successRateEjection": {}, "failurePercentageEjection": null}"#,
        )
        .unwrap();
        assert_eq!(config.success_rate(), Some(SuccessRateEjection::default()));
        assert_eq!(config.failure_percentage(), None);
        let config = OutlierDetection::from_json(
            r#"{"outlier_detection_experimental": {"failurePercentageEjection": {}}}"#,
        )
        .unwrap();
        assert_eq!(
            config.failure_percentage(),
            Some(FailurePercentageEjection::default())
        );
    }

    #[test]
    fn every_field_is_read() {
        let config = OutlierDetection::from_json(
            r#"{
              "interval": "0.5s", "baseEjectionTime": "2s", "maxEjectionTime": "20s",
              "maxEjectionPercent": 100,
              "successRateEjection": {"stdevFactor": 1000, "enforcementPercentage": 50,
                                      "minimumHosts": 2, "requestVolume": 7},
              "failurePercentageEjection": {"threshold": "60", "enforcementPercentage": 1e2,
                                            "minimumHosts": 1, "requestVolume": 3.0},
              "childPolicy": [{"round_robin": {}}], "somethingNew": true
            }"#,
        )
        .unwrap();
        assert_eq!(config.interval(), Duration::from_millis(500));
        assert_eq!(config.base_ejection_time(), Duration::from_secs(2));
        assert_eq!(config.max_ejection_time(), Duration::from_secs(20));
        assert_eq!(config.max_ejection_percent(), 100);
        assert_eq!(
            config.success_rate(),
            Some(SuccessRateEjection {
                stdev_factor: 1000,
                enforcement_percentage: 50,
                minimum_hosts: 2,
                request_volume: 7
            })
        );
        assert_eq!(
            config.failure_percentage(),
            Some(FailurePercentageEjection {
                threshold: 60,
                enforcement_percentage: 100,
                minimum_hosts: 1,
                request_volume: 3
            })
        );
    }

    #[test]
    fn bad_values_name_the_field_and_the_rule() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "[]",
                "",
                "outlier detection config: must be an object, got an array",
            ),
            (
                "{",
                "",
                "outlier detection config: invalid JSON at line 1 column 1: EOF while parsing an object",
            ),
            (
                r#"{"interval": "0s"}"#,
                "interval",
                "interval: must be a duration > 0, got \"0s\"",
            ),
            (
                r#"{"interval": 10}"#,
                "interval",
                "interval: must be a duration string such as \"0.1s\", got 10",
            ),
            (
                r#"{"interval": "10"}"#,
                "interval",
                "interval: must be a proto3 JSON duration: duration must end with 's', got \"10\"",
            ),
            (
                r#"{"baseEjectionTime": "-1s"}"#,
                "baseEjectionTime",
                "baseEjectionTime: must be a duration >= 0, got \"-1s\"",
            ),
            (
                r#"{"maxEjectionTime": "1m"}"#,
                "maxEjectionTime",
                "maxEjectionTime: must be a proto3 JSON duration: duration must end with 's', got \"1m\"",
            ),
            (
                r#"{"maxEjectionPercent": -1}"#,
                "maxEjectionPercent",
                "maxEjectionPercent: must be an unsigned 32-bit integer (0 to 4294967295), got -1",
            ),
            (
                r#"{"maxEjectionPercent": 4294967296}"#,
                "maxEjectionPercent",
                "maxEjectionPercent: must be an unsigned 32-bit integer (0 to 4294967295), got 4294967296",
            ),
            (
                r#"{"maxEjectionPercent": 1.5}"#,
                "maxEjectionPercent",
                "maxEjectionPercent: must be an unsigned 32-bit integer (0 to 4294967295), got 1.5",
            ),
            (
                r#"{"maxEjectionPercent": "ten"}"#,
                "maxEjectionPercent",
                "maxEjectionPercent: must be an unsigned 32-bit integer (0 to 4294967295), got \"ten\"",
            ),
            (
                r#"{"maxEjectionPercent": true}"#,
                "maxEjectionPercent",
                "maxEjectionPercent: must be an unsigned 32-bit integer, got true",
            ),
            (
                r#"{"successRateEjection": []}"#,
                "successRateEjection",
                "successRateEjection: must be an object, got an array",
            ),
            (
                r#"{"successRateEjection": {"enforcementPercentage": 101}}"#,
                "successRateEjection.enforcementPercentage",
                "successRateEjection.enforcementPercentage: must be at most 100, got 101",
            ),
            (
                r#"{"failurePercentageEjection": {"threshold": 200}}"#,
                "failurePercentageEjection.threshold",
                "failurePercentageEjection.threshold: must be at most 100, got 200",
            ),
            (
                r#"{"outlier_detection_experimental": {"failurePercentageEjection": {"requestVolume": {}}}}"#,
                "outlier_detection_experimental.failurePercentageEjection.requestVolume",
                "outlier_detection_experimental.failurePercentageEjection.requestVolume: must be an unsigned 32-bit integer, got an object",
            ),
            (
                r#"{"outlier_detection_experimental": 3}"#,
                "outlier_detection_experimental",
                "outlier_detection_experimental: must be an object, got 3",
            ),
        ];
        for (json, field, message) in cases {
            let (got_field, _, got_message) = error(json);
            assert_eq!(&got_field, field, "{json}");
            assert_eq!(&got_message, message, "{json}");
        }
        let long = format!("{{\"interval\": \"{}\"}}", "9".repeat(MAX_DOCUMENT_BYTES));
        assert!(matches!(error(&long).1, Rule::DocumentTooLarge { .. }));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(matches!(error(&deep).1, Rule::Json { .. }));
    }
}
