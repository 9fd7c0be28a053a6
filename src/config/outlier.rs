//! Outlier detection from the JSON of gRPC's `outlier_detection_experimental` policy, read
//! with the service config's tables, readers, limits and errors, through
//! [`OutlierDetectionBuilder`], whose checks are the only ones.

use serde_json::Value;

use super::parse::{
    NotUnsigned, document, non_negative_duration, object, positive_duration, unsigned, wrong_type,
};
use super::table::{Field, Reader, read_fields, set};
use super::unknown::{Unknown, UnknownKeys};
use super::{ConfigError, Rule};
use crate::balance::{
    FailurePercentageEjection, OutlierDetection, OutlierDetectionBuilder, SuccessRateEjection,
};

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
    /// half-life, the weighed pick and the failure codes keep the balancer's defaults.
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
    let (value, path) = match root.get(POLICY_NAME) {
        Some(inner) if root.len() == 1 => (inner, POLICY_NAME),
        _ => (&value, ""),
    };
    // gRPC ignores the keys it does not read (`childPolicy`), and so does this reader.
    let mut reader = Reader::new(UnknownKeys::new(Unknown::Ignore));
    let mut config = OutlierDetection::a50_defaults();
    read_fields(&mut config, value, path, OUTLIER_DETECTION, &mut reader)?;
    Ok(config)
}

/// A50's config object. Every field is set through the builder, whose checks (each percentage
/// at most 100) are the only ones: built after each field, so that an error names the JSON
/// field that broke a check (the builder's own error names its setting, not the key).
const OUTLIER_DETECTION: &[Field<OutlierDetection>] = &[
    Field::read_only("interval", |c, v, at, _| {
        built(c.to_builder().interval(positive_duration(v, at)?), c, v, at)
    }),
    Field::read_only("baseEjectionTime", |c, v, at, _| {
        let base = non_negative_duration(v, at)?;
        built(c.to_builder().base_ejection_time(base), c, v, at)
    }),
    Field::read_only("maxEjectionTime", |c, v, at, _| {
        let max = non_negative_duration(v, at)?;
        built(c.to_builder().max_ejection_time(max), c, v, at)
    }),
    Field::read_only("maxEjectionPercent", |c, v, at, _| {
        let percent = uint32(v, at)?;
        built(c.to_builder().max_ejection_percent(percent), c, v, at)
    }),
    Field::read_only("successRateEjection", |c, v, at, reader| {
        let ejection = Some(SuccessRateEjection::default());
        built(c.to_builder().success_rate(ejection), c, v, at)?;
        read_fields(c, v, at, SUCCESS_RATE_EJECTION, reader)
    }),
    Field::read_only("failurePercentageEjection", |c, v, at, reader| {
        let ejection = Some(FailurePercentageEjection::default());
        built(c.to_builder().failure_percentage(ejection), c, v, at)?;
        read_fields(c, v, at, FAILURE_PERCENTAGE_EJECTION, reader)
    }),
];

// The keys both ejections have.
const ENFORCEMENT_PERCENTAGE: &str = "enforcementPercentage";
const MINIMUM_HOSTS: &str = "minimumHosts";
const REQUEST_VOLUME: &str = "requestVolume";

/// `successRateEjection`, read into the detection's success-rate ejection.
const SUCCESS_RATE_EJECTION: &[Field<OutlierDetection>] = &[
    Field::read_only("stdevFactor", |c, v, at, _| {
        success_rate(c, v, at, |e, n| e.stdev_factor = n)
    }),
    Field::read_only(ENFORCEMENT_PERCENTAGE, |c, v, at, _| {
        success_rate(c, v, at, |e, n| e.enforcement_percentage = n)
    }),
    Field::read_only(MINIMUM_HOSTS, |c, v, at, _| {
        success_rate(c, v, at, |e, n| e.minimum_hosts = n)
    }),
    Field::read_only(REQUEST_VOLUME, |c, v, at, _| {
        success_rate(c, v, at, |e, n| e.request_volume = n)
    }),
];

/// `failurePercentageEjection`, read into the detection's failure-percentage ejection.
const FAILURE_PERCENTAGE_EJECTION: &[Field<OutlierDetection>] = &[
    Field::read_only("threshold", |c, v, at, _| {
        failure_percentage(c, v, at, |e, n| e.threshold = n)
    }),
    Field::read_only(ENFORCEMENT_PERCENTAGE, |c, v, at, _| {
        failure_percentage(c, v, at, |e, n| e.enforcement_percentage = n)
    }),
    Field::read_only(MINIMUM_HOSTS, |c, v, at, _| {
        failure_percentage(c, v, at, |e, n| e.minimum_hosts = n)
    }),
    Field::read_only(REQUEST_VOLUME, |c, v, at, _| {
        failure_percentage(c, v, at, |e, n| e.request_volume = n)
    }),
];

/// Sets `config` to what `builder` builds; a builder error is the field's at `path`. Of the
/// builder's checks, JSON can break only a percentage's (the duration grammar refuses an
/// `interval` of zero first), whose rule is [`Rule::Percent`]; a new check of the builder's
/// needs a rule of its own here (no assertion: the input is untrusted, and a debug build must
/// not panic on it either).
fn built(
    builder: OutlierDetectionBuilder,
    config: &mut OutlierDetection,
    value: &Value,
    path: &str,
) -> Result<(), ConfigError> {
    match builder.build() {
        Ok(built) => set(config, built),
        Err(_) => Err(ConfigError::got(path, Rule::Percent, value)),
    }
}

/// Sets one `uint32` of the success-rate ejection.
fn success_rate(
    config: &mut OutlierDetection,
    value: &Value,
    path: &str,
    field: fn(&mut SuccessRateEjection, u32),
) -> Result<(), ConfigError> {
    let mut ejection = config.success_rate().unwrap_or_default();
    field(&mut ejection, uint32(value, path)?);
    built(
        config.to_builder().success_rate(Some(ejection)),
        config,
        value,
        path,
    )
}

/// Sets one `uint32` of the failure-percentage ejection.
fn failure_percentage(
    config: &mut OutlierDetection,
    value: &Value,
    path: &str,
    field: fn(&mut FailurePercentageEjection, u32),
) -> Result<(), ConfigError> {
    let mut ejection = config.failure_percentage().unwrap_or_default();
    field(&mut ejection, uint32(value, path)?);
    built(
        config.to_builder().failure_percentage(Some(ejection)),
        config,
        value,
        path,
    )
}

/// A proto3 JSON `uint32`: a number with no fraction, or a string of decimal digits.
fn uint32(value: &Value, path: &str) -> Result<u32, ConfigError> {
    let out_of_range = || ConfigError::got(path, Rule::Uint32, value);
    match unsigned(value) {
        Ok(n) => u32::try_from(n).map_err(|_| out_of_range()),
        Err(NotUnsigned::Invalid) => Err(out_of_range()),
        Err(NotUnsigned::WrongType) => Err(wrong_type(path, "an unsigned 32-bit integer", value)),
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
    fn integers_are_proto3s_numbers_or_decimal_strings() {
        let config = OutlierDetection::from_json(
            r#"{"maxEjectionPercent": "100", "successRateEjection": {"stdevFactor": "4294967295",
                "minimumHosts": 2e0, "requestVolume": "007"}}"#,
        )
        .unwrap();
        assert_eq!(config.max_ejection_percent(), 100);
        let success_rate = config.success_rate().unwrap();
        assert_eq!(success_rate.stdev_factor, u32::MAX);
        assert_eq!(success_rate.minimum_hosts, 2);
        assert_eq!(success_rate.request_volume, 7);
        for bad in [r#""4294967296""#, r#""-1""#, r#""1e2""#, r#""""#, "-0.5"] {
            let json = format!(r#"{{"failurePercentageEjection": {{"minimumHosts": {bad}}}}}"#);
            let (path, rule, _) = error(&json);
            assert_eq!(path, "failurePercentageEjection.minimumHosts", "{json}");
            assert_eq!(rule, Rule::Uint32, "{json}");
        }
        // A percentage is the builder's to check, whichever way it is written.
        let (path, rule, message) = error(r#"{"failurePercentageEjection": {"threshold": "101"}}"#);
        assert_eq!(path, "failurePercentageEjection.threshold");
        assert_eq!(rule, Rule::Percent);
        assert_eq!(
            message,
            "failurePercentageEjection.threshold: must be at most 100, got \"101\""
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
