//! Outlier detection from the JSON of gRPC's `outlier_detection_experimental` policy.

use std::time::Duration;

use serde_json::Value;

use super::{
    FailurePercentageEjection, OutlierDetection, OutlierDetectionError, OutlierRule,
    SuccessRateEjection,
};
use crate::config::{MAX_DOCUMENT_BYTES, parse_duration};

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
    /// integer out of range is an [`OutlierDetectionError`] naming the field and the rule.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::balance::OutlierDetection;
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
    /// assert_eq!(error.field(), "maxEjectionPercent");
    /// assert_eq!(error.to_string(), "maxEjectionPercent: must be at most 100, got 101");
    /// # Ok::<(), tower_retry_hedge::balance::OutlierDetectionError>(())
    /// ```
    pub fn from_json(json: &str) -> Result<OutlierDetection, OutlierDetectionError> {
        if json.len() > MAX_DOCUMENT_BYTES {
            return Err(OutlierDetectionError {
                field: String::new(),
                rule: OutlierRule::DocumentTooLarge {
                    max: MAX_DOCUMENT_BYTES,
                },
                got: Some(format!("{} bytes", json.len())),
            });
        }
        let value: Value = serde_json::from_str(json).map_err(|error| {
            let (line, column) = (error.line(), error.column());
            let full = error.to_string();
            let suffix = format!(" at line {line} column {column}");
            let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
            OutlierDetectionError::new(
                "",
                OutlierRule::Json {
                    line,
                    column,
                    message,
                },
            )
        })?;
        let (object, prefix) = match value.as_object() {
            Some(object) if object.len() == 1 && object.contains_key(POLICY_NAME) => {
                match &object[POLICY_NAME] {
                    Value::Object(inner) => (inner, format!("{POLICY_NAME}.")),
                    other => return Err(wrong_type(POLICY_NAME, "an object", other)),
                }
            }
            Some(object) => (object, String::new()),
            None => return Err(wrong_type("", "an object", &value)),
        };
        let field = |name: &str| -> (String, Option<&Value>) {
            let value = object.get(name).filter(|v| !v.is_null());
            (format!("{prefix}{name}"), value)
        };

        let mut config = OutlierDetection {
            enabled: true,
            interval: Duration::from_secs(10),
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_percent: 10,
            success_rate: None,
            failure_percentage: None,
            consecutive_failures: None,
            ..OutlierDetection::default()
        };
        if let (path, Some(value)) = field("interval") {
            config.interval = duration(&path, value)?;
            if config.interval.is_zero() {
                return Err(OutlierDetectionError::got(
                    path,
                    OutlierRule::NotPositive,
                    value,
                ));
            }
        }
        if let (path, Some(value)) = field("baseEjectionTime") {
            config.base_ejection_time = duration(&path, value)?;
        }
        if let (path, Some(value)) = field("maxEjectionTime") {
            config.max_ejection_time = duration(&path, value)?;
        }
        if let (path, Some(value)) = field("maxEjectionPercent") {
            config.max_ejection_percent = percent(&path, value)?;
        }
        if let (path, Some(value)) = field("successRateEjection") {
            let object = value
                .as_object()
                .ok_or_else(|| wrong_type(&path, "an object", value))?;
            let mut success_rate = SuccessRateEjection::default();
            let sub = |name: &str| {
                let value = object.get(name).filter(|v| !v.is_null());
                (format!("{path}.{name}"), value)
            };
            if let (path, Some(value)) = sub("stdevFactor") {
                success_rate.stdev_factor = uint32(&path, value)?;
            }
            if let (path, Some(value)) = sub("enforcementPercentage") {
                success_rate.enforcement_percentage = percent(&path, value)?;
            }
            if let (path, Some(value)) = sub("minimumHosts") {
                success_rate.minimum_hosts = uint32(&path, value)?;
            }
            if let (path, Some(value)) = sub("requestVolume") {
                success_rate.request_volume = uint32(&path, value)?;
            }
            config.success_rate = Some(success_rate);
        }
        if let (path, Some(value)) = field("failurePercentageEjection") {
            let object = value
                .as_object()
                .ok_or_else(|| wrong_type(&path, "an object", value))?;
            let mut failure_percentage = FailurePercentageEjection::default();
            let sub = |name: &str| {
                let value = object.get(name).filter(|v| !v.is_null());
                (format!("{path}.{name}"), value)
            };
            if let (path, Some(value)) = sub("threshold") {
                failure_percentage.threshold = percent(&path, value)?;
            }
            if let (path, Some(value)) = sub("enforcementPercentage") {
                failure_percentage.enforcement_percentage = percent(&path, value)?;
            }
            if let (path, Some(value)) = sub("minimumHosts") {
                failure_percentage.minimum_hosts = uint32(&path, value)?;
            }
            if let (path, Some(value)) = sub("requestVolume") {
                failure_percentage.request_volume = uint32(&path, value)?;
            }
            config.failure_percentage = Some(failure_percentage);
        }
        Ok(config)
    }
}

/// The name gRPC registers the policy under.
const POLICY_NAME: &str = "outlier_detection_experimental";

fn wrong_type(path: &str, expected: &'static str, value: &Value) -> OutlierDetectionError {
    OutlierDetectionError::got(path, OutlierRule::WrongType { expected }, value)
}

fn duration(path: &str, value: &Value) -> Result<Duration, OutlierDetectionError> {
    let text = value
        .as_str()
        .ok_or_else(|| wrong_type(path, "a duration string such as \"10s\"", value))?;
    parse_duration(text)
        .map_err(|error| OutlierDetectionError::got(path, OutlierRule::Duration(error), value))
}

/// A proto3 JSON `uint32`: a number with no fraction, or a string of decimal digits.
fn uint32(path: &str, value: &Value) -> Result<u32, OutlierDetectionError> {
    let out_of_range = || OutlierDetectionError::got(path, OutlierRule::OutOfRange, value);
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
        other => Err(wrong_type(path, "an unsigned 32-bit integer", other)),
    }
}

fn percent(path: &str, value: &Value) -> Result<u32, OutlierDetectionError> {
    let n = uint32(path, value)?;
    if n > 100 {
        return Err(OutlierDetectionError::got(
            path,
            OutlierRule::Percent,
            value,
        ));
    }
    Ok(n)
}
