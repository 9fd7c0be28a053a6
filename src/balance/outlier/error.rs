//! Errors of outlier-detection settings.

use std::fmt;

use serde_json::Value;

use crate::config::DurationError;

/// The rule an outlier-detection setting broke; see [`OutlierDetectionError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutlierRule {
    /// The document is not JSON (or nests deeper than 128 levels).
    Json {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// What serde_json found wrong.
        message: String,
    },
    /// The document is longer than 1 MiB.
    DocumentTooLarge {
        /// The limit, in bytes.
        max: usize,
    },
    /// A value has the wrong JSON type.
    WrongType {
        /// What it must be, such as `an object`.
        expected: &'static str,
    },
    /// A duration is not a non-negative proto3 JSON duration.
    Duration(DurationError),
    /// A duration that must be > 0 (`interval`, the failure half-life) is zero.
    NotPositive,
    /// A percentage (or `threshold`) is above 100.
    Percent,
    /// An integer is not in `[0, 4294967295]` (or has a fraction).
    OutOfRange,
    /// A run of consecutive failures of zero.
    AtLeastOne,
}

impl fmt::Display for OutlierRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutlierRule::Json {
                line,
                column,
                message,
            } => write!(f, "invalid JSON at line {line} column {column}: {message}"),
            OutlierRule::DocumentTooLarge { max } => write!(f, "must be at most {max} bytes long"),
            OutlierRule::WrongType { expected } => write!(f, "must be {expected}"),
            OutlierRule::Duration(error) => {
                write!(f, "must be a proto3 JSON duration: {error}")
            }
            OutlierRule::NotPositive => f.write_str("must be a duration > 0"),
            OutlierRule::Percent => f.write_str("must be at most 100"),
            OutlierRule::OutOfRange => {
                f.write_str("must be an unsigned 32-bit integer (0 to 4294967295)")
            }
            OutlierRule::AtLeastOne => f.write_str("must be at least 1 (None turns it off)"),
        }
    }
}

/// An outlier-detection setting that breaks a rule: which field (a JSON path such as
/// `failurePercentageEjection.threshold`, or the builder's name such as
/// `max_ejection_percent`), which [`OutlierRule`], and the offending value.
///
/// ```
/// use tower_retry_hedge::balance::{OutlierDetection, OutlierRule};
///
/// let error = OutlierDetection::from_json(r#"{"baseEjectionTime": "-1s"}"#).unwrap_err();
/// assert_eq!(error.field(), "baseEjectionTime");
/// assert!(matches!(error.rule(), OutlierRule::Duration(_)));
/// assert_eq!(
///     error.to_string(),
///     "baseEjectionTime: must be a proto3 JSON duration: duration must not be negative, got \"-1s\""
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlierDetectionError {
    pub(super) field: String,
    pub(super) rule: OutlierRule,
    pub(super) got: Option<String>,
}

impl OutlierDetectionError {
    pub(super) fn new(field: impl Into<String>, rule: OutlierRule) -> Self {
        OutlierDetectionError {
            field: field.into(),
            rule,
            got: None,
        }
    }

    pub(super) fn got(field: impl Into<String>, rule: OutlierRule, value: &Value) -> Self {
        OutlierDetectionError {
            field: field.into(),
            rule,
            got: Some(crate::config::quote_json(value)),
        }
    }

    /// The field: a JSON path, or the builder method's name; empty for the document itself.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The rule broken.
    pub fn rule(&self) -> &OutlierRule {
        &self.rule
    }

    /// The offending value, as JSON text cut to 64 characters (or its JSON type for objects
    /// and arrays), when there is one.
    pub fn value(&self) -> Option<&str> {
        self.got.as_deref()
    }
}

impl fmt::Display for OutlierDetectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "outlier detection config: {}", self.rule)?;
        } else {
            write!(f, "{}: {}", self.field, self.rule)?;
        }
        if let Some(got) = &self.got {
            write!(f, ", got {got}")?;
        }
        Ok(())
    }
}

impl std::error::Error for OutlierDetectionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.rule {
            OutlierRule::Duration(error) => Some(error),
            _ => None,
        }
    }
}
