//! What a service config can break, and where: [`Rule`] and [`ConfigError`].

use std::fmt;

use serde_json::Value;

use super::{DurationError, MAX_DOCUMENT_BYTES};

/// What a document is, in an error message, unless it says otherwise.
const SERVICE_CONFIG: &str = "service config";

/// The longest a value quoted in an error message may be, in characters.
const MAX_QUOTED_CHARS: usize = 64;

/// The rule a service config broke; see [`ConfigError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rule {
    /// The document is not JSON (or nests deeper than 128 levels).
    Json {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// What serde_json found wrong, such as `expected value`.
        message: String,
    },
    /// The document is longer than 1 MiB.
    DocumentTooLarge {
        /// The limit, in bytes.
        max: usize,
    },
    /// An array has more entries than its limit
    /// (10 000 method configs,
    /// 100 status codes).
    TooManyEntries {
        /// The limit.
        max: usize,
    },
    /// All method configs together have more than 10 000 names.
    TooManyNames {
        /// The limit.
        max: usize,
    },
    /// A required field is absent (or `null`).
    Missing,
    /// A value has the wrong JSON type.
    WrongType {
        /// What it must be, such as `an object`.
        expected: &'static str,
    },
    /// `maxAttempts` is not an integer >= 2.
    MaxAttempts,
    /// A duration string is not a proto3 JSON duration (never
    /// [`DurationError::Negative`]: that is [`Rule::Negative`] or [`Rule::NotPositive`]).
    Duration(DurationError),
    /// A duration that must be > 0 (a backoff, outlier detection's `interval`) is zero or
    /// negative.
    NotPositive,
    /// A duration that must be >= 0 (`timeout`, `hedgingDelay`) is negative.
    Negative,
    /// `backoffMultiplier` is not a number > 0.
    BackoffMultiplier,
    /// `retryableStatusCodes` is an empty array.
    EmptyStatusCodes,
    /// A status code is neither an integer 0-16 nor a gRPC status code name.
    UnknownStatusCode,
    /// A method config holds both `retryPolicy` and `hedgingPolicy`.
    BothPolicies,
    /// `maxTokens` is not an integer in (0, 1000].
    MaxTokens,
    /// `tokenRatio` is not a number that is > 0 once cut to three decimals.
    TokenRatio,
    /// A name has a `method` but no `service`.
    MethodWithoutService,
    /// The same service/method name appears twice.
    DuplicateName {
        /// The path of the first occurrence, such as `methodConfig[0].name[1]`.
        first: String,
    },
    /// A second default name (no service, no method).
    DuplicateDefault {
        /// The path of the first default name.
        first: String,
    },
    /// `maxRequestMessageBytes` or `maxResponseMessageBytes` is not an integer >= 0.
    MessageBytes,
    /// An outlier-detection integer is not in `[0, 4294967295]` (or has a fraction).
    Uint32,
    /// An outlier-detection percentage (or `threshold`) is above 100.
    Percent,
    /// A key gRPC does not define in this object (refused only by
    /// [`ServiceConfig::from_json_strict`](super::ServiceConfig::from_json_strict); a
    /// plain parse ignores it and lists it in
    /// [`ServiceConfig::ignored`](super::ServiceConfig::ignored)).
    UnknownField {
        /// The field of the same object the key is a near miss of, if any (see
        /// [`IgnoredKey::suggestion`](super::IgnoredKey::suggestion)).
        suggestion: Option<&'static str>,
    },
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Json {
                line,
                column,
                message,
            } => write!(f, "invalid JSON at line {line} column {column}: {message}"),
            Rule::DocumentTooLarge { max } => write!(f, "must be at most {max} bytes long"),
            Rule::TooManyEntries { max } => write!(f, "must have at most {max} entries"),
            Rule::TooManyNames { max } => {
                write!(
                    f,
                    "all method configs together may have at most {max} names"
                )
            }
            Rule::Missing => f.write_str("is required"),
            Rule::WrongType { expected } => write!(f, "must be {expected}"),
            Rule::MaxAttempts => f.write_str("must be an integer >= 2"),
            Rule::Duration(error) => write!(f, "must be a proto3 JSON duration: {error}"),
            Rule::NotPositive => f.write_str("must be a duration > 0"),
            Rule::Negative => f.write_str("must be a duration >= 0"),
            Rule::BackoffMultiplier => f.write_str("must be a number > 0"),
            Rule::EmptyStatusCodes => f.write_str("must hold at least one status code"),
            Rule::UnknownStatusCode => f.write_str(
                "must be a gRPC status code: an integer 0-16 or a case-insensitive name",
            ),
            Rule::BothPolicies => f.write_str("must not hold both retryPolicy and hedgingPolicy"),
            Rule::MaxTokens => f.write_str("must be an integer in (0, 1000]"),
            Rule::TokenRatio => {
                f.write_str("must be a number >= 0.001 (digits past the third decimal are dropped)")
            }
            Rule::MethodWithoutService => f.write_str("names a method but no service"),
            Rule::DuplicateName { first } => write!(f, "repeats the name at {first}"),
            Rule::DuplicateDefault { first } => write!(
                f,
                "is a second default name (no service); the first is at {first}"
            ),
            Rule::MessageBytes => f.write_str("must be an integer >= 0"),
            Rule::Uint32 => f.write_str("must be an unsigned 32-bit integer (0 to 4294967295)"),
            Rule::Percent => f.write_str("must be at most 100"),
            Rule::UnknownField { suggestion } => {
                f.write_str("is not a field of gRPC's service config")?;
                match suggestion {
                    Some(field) => write!(f, " (did you mean {field}?)"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A service config, or the outlier-detection config of its balancer
/// ([`OutlierDetection::from_json`](crate::balance::OutlierDetection::from_json), feature
/// `balance`), that breaks a rule: where (a JSON path such as
/// `methodConfig[0].retryPolicy.maxAttempts`), which [`Rule`], and the offending value.
///
/// A required field that is absent while a near miss of its name is present says so:
/// `methodConfig[0].retryPolicy.maxAttempts: is required (found "maxAttempt": did you mean
/// maxAttempts?)` (see [`ConfigError::near_miss`]).
///
/// ```
/// use tower_retry_hedge::config::{Rule, ServiceConfig};
///
/// let err = ServiceConfig::from_json("{\"methodConfig\": [}").unwrap_err();
/// assert!(matches!(err.rule(), Rule::Json { line: 1, column: 19, .. }));
/// assert_eq!(err.path(), "");
/// assert_eq!(
///     err.to_string(),
///     "service config: invalid JSON at line 1 column 19: expected value"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    path: String,
    rule: Rule,
    got: Option<String>,
    near_miss: Option<Box<NearMiss>>,
    /// What the document is, for an error of the document itself.
    document: &'static str,
}

/// The key found where a required field is absent, and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NearMiss {
    found: String,
    field: &'static str,
}

impl ConfigError {
    pub(super) fn new(path: impl Into<String>, rule: Rule) -> ConfigError {
        ConfigError {
            path: path.into(),
            rule,
            got: None,
            near_miss: None,
            document: SERVICE_CONFIG,
        }
    }

    /// The required `field` is absent at `path`; `found` is a key of the same object that
    /// is a near miss of it, if there is one.
    pub(super) fn missing(
        path: impl Into<String>,
        field: &'static str,
        found: Option<String>,
    ) -> ConfigError {
        ConfigError {
            near_miss: found.map(|found| Box::new(NearMiss { found, field })),
            ..ConfigError::new(path, Rule::Missing)
        }
    }

    /// A key gRPC does not define, refused by a strict parse.
    pub(super) fn unknown_field(
        path: impl Into<String>,
        suggestion: Option<&'static str>,
    ) -> ConfigError {
        ConfigError::new(path, Rule::UnknownField { suggestion })
    }

    pub(super) fn got(path: impl Into<String>, rule: Rule, value: &Value) -> ConfigError {
        ConfigError {
            path: path.into(),
            rule,
            got: Some(quote(value)),
            near_miss: None,
            document: SERVICE_CONFIG,
        }
    }

    /// A document of `len` bytes, longer than 1 MiB.
    pub(super) fn document_too_large(len: usize) -> ConfigError {
        ConfigError {
            path: String::new(),
            rule: Rule::DocumentTooLarge {
                max: MAX_DOCUMENT_BYTES,
            },
            got: Some(format!("{len} bytes")),
            near_miss: None,
            document: SERVICE_CONFIG,
        }
    }

    pub(super) fn from_json_error(error: &serde_json::Error) -> ConfigError {
        let (line, column) = (error.line(), error.column());
        let full = error.to_string();
        let suffix = format!(" at line {line} column {column}");
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
        ConfigError::new(
            "",
            Rule::Json {
                line,
                column,
                message,
            },
        )
    }

    /// This error, of a document that is `document` (such as `outlier detection config`).
    #[cfg(feature = "balance")]
    pub(super) fn of(mut self, document: &'static str) -> ConfigError {
        self.document = document;
        self
    }

    /// The JSON path of the offending value, such as `retryThrottling.maxTokens` or
    /// `methodConfig[2].name[0]`; empty for the document itself.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The rule broken.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The offending value, as JSON text cut to 64 characters (or its JSON type for
    /// objects and arrays, or the document length for [`Rule::DocumentTooLarge`]), when
    /// there is one.
    pub fn value(&self) -> Option<&str> {
        self.got.as_deref()
    }

    /// For [`Rule::Missing`]: a key of the same object that looks like a misspelling of
    /// the absent field (cut to 64 characters), if
    /// there is one.
    ///
    /// ```
    /// use tower_retry_hedge::config::{Rule, ServiceConfig};
    ///
    /// let err = ServiceConfig::from_json(r#"{"methodConfig": [{"name": [{}],
    ///     "retryPolicy": {"maxAttempt": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///                     "backoffMultiplier": 2, "retryableStatusCodes": [14]}}]}"#)
    /// .unwrap_err();
    /// assert_eq!(err.rule(), &Rule::Missing);
    /// assert_eq!(err.near_miss(), Some("maxAttempt"));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "methodConfig[0].retryPolicy.maxAttempts: is required \
    ///      (found \"maxAttempt\": did you mean maxAttempts?)"
    /// );
    /// ```
    pub fn near_miss(&self) -> Option<&str> {
        self.near_miss.as_ref().map(|near| near.found.as_str())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.document, self.rule)?;
        } else {
            write!(f, "{}: {}", self.path, self.rule)?;
        }
        if let Some(near) = &self.near_miss {
            let NearMiss { found, field } = &**near;
            write!(f, " (found {found:?}: did you mean {field}?)")?;
        }
        if let Some(got) = &self.got {
            write!(f, ", got {got}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.rule {
            Rule::Duration(error) => Some(error),
            _ => None,
        }
    }
}

/// A short, bounded rendering of a JSON value for error messages.
/// A JSON value as an error message quotes it: a string cut to 64 characters, the type of an
/// array or object.
pub(crate) fn quote(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let mut cut: String = s.chars().take(MAX_QUOTED_CHARS).collect();
            if cut.len() < s.len() {
                cut.push('\u{2026}');
            }
            format!("{cut:?}")
        }
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_bounded() {
        let long = Value::String("x".repeat(10_000));
        assert!(quote(&long).chars().count() <= MAX_QUOTED_CHARS + 3);
        assert_eq!(quote(&Value::Array(vec![])), "an array");
    }
}
