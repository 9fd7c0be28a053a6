//! The HTTP classifier: retryable statuses, `Retry-After` as pushback.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode, header::RETRY_AFTER};

use super::{AttemptResult, Classify, Outcome, transport_outcome};
use crate::pushback::{Pushback, retry_after};

/// Retryable HTTP statuses, with `Retry-After` read as pushback.
///
/// By default 502, 503 and 504 are retryable, and 429 when it carries a `Retry-After` the
/// client can honour (a 429 without one says "not now" without saying when, so retrying at
/// backoff speed would only add to the overload). A `Retry-After` above
/// [`max_retry_after`](HttpStatuses::max_retry_after) (default 30 s) is ignored and the
/// backoff applies, so a hostile or broken server cannot park a call.
///
/// Errors that prove the request was never sent, or refused before processing, are
/// [`Outcome::NotSent`] / [`Outcome::Refused`]; other errors are retryable (the policy's
/// idempotency gate keeps non-idempotent methods from being retried after them).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_retry_hedge::classify::{AttemptResult, Classify, HttpStatuses, Outcome};
/// use tower_retry_hedge::pushback::Pushback;
///
/// let classifier = HttpStatuses::default();
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("2"));
/// let outcome = classifier.classify(AttemptResult::Response {
///     status: StatusCode::TOO_MANY_REQUESTS,
///     headers: &headers,
/// });
/// assert_eq!(outcome, Outcome::Retryable(Some(Pushback::After(Duration::from_secs(2)))));
/// ```
#[derive(Debug, Clone)]
pub struct HttpStatuses {
    retryable: Vec<StatusCode>,
    too_many_requests_needs_retry_after: bool,
    max_retry_after: Duration,
}

impl Default for HttpStatuses {
    fn default() -> HttpStatuses {
        HttpStatuses {
            retryable: vec![
                StatusCode::BAD_GATEWAY,
                StatusCode::SERVICE_UNAVAILABLE,
                StatusCode::GATEWAY_TIMEOUT,
            ],
            too_many_requests_needs_retry_after: true,
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl HttpStatuses {
    /// An empty set: only transport errors are retried.
    pub fn none() -> HttpStatuses {
        HttpStatuses {
            retryable: Vec::new(),
            too_many_requests_needs_retry_after: false,
            ..HttpStatuses::default()
        }
    }

    /// Adds a retryable status. Adding 429 makes it retryable with or without `Retry-After`.
    #[must_use]
    pub fn with(mut self, status: StatusCode) -> HttpStatuses {
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.too_many_requests_needs_retry_after = false;
        }
        if !self.retryable.contains(&status) {
            self.retryable.push(status);
        }
        self
    }

    /// The largest `Retry-After` honoured; a larger one falls back to the backoff.
    #[must_use]
    pub fn max_retry_after(mut self, max: Duration) -> HttpStatuses {
        self.max_retry_after = max;
        self
    }

    fn pushback(&self, headers: &HeaderMap) -> Option<Pushback> {
        let mut values = headers.get_all(RETRY_AFTER).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let delay = retry_after(value, SystemTime::now())?;
        (delay <= self.max_retry_after).then_some(Pushback::After(delay))
    }
}

impl Classify for HttpStatuses {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        match result {
            AttemptResult::Response { status, headers } => {
                if status == StatusCode::TOO_MANY_REQUESTS
                    && self.too_many_requests_needs_retry_after
                {
                    return match self.pushback(headers) {
                        Some(pushback) => Outcome::Retryable(Some(pushback)),
                        None => Outcome::Fatal(None),
                    };
                }
                if self.retryable.contains(&status) {
                    Outcome::Retryable(self.pushback(headers))
                } else {
                    Outcome::Success
                }
            }
            AttemptResult::Error(error) => {
                transport_outcome(error).unwrap_or(Outcome::Retryable(None))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn classify(c: &HttpStatuses, status: u16, retry_after: Option<&'static str>) -> Outcome {
        let mut headers = HeaderMap::new();
        if let Some(v) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from_static(v));
        }
        c.classify(AttemptResult::Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers: &headers,
        })
    }

    #[test]
    fn default_statuses() {
        let c = HttpStatuses::default();
        assert_eq!(classify(&c, 200, None), Outcome::Success);
        assert_eq!(classify(&c, 500, None), Outcome::Success);
        assert_eq!(classify(&c, 404, None), Outcome::Success);
        assert_eq!(classify(&c, 502, None), Outcome::Retryable(None));
        assert_eq!(classify(&c, 503, None), Outcome::Retryable(None));
        assert_eq!(classify(&c, 504, None), Outcome::Retryable(None));
        assert_eq!(classify(&c, 429, None), Outcome::Fatal(None));
        assert_eq!(
            classify(&c, 429, Some("3")),
            Outcome::Retryable(Some(Pushback::After(Duration::from_secs(3))))
        );
    }

    #[test]
    fn retry_after_over_the_cap_falls_back_to_backoff() {
        let c = HttpStatuses::default().max_retry_after(Duration::from_secs(10));
        assert_eq!(classify(&c, 503, Some("11")), Outcome::Retryable(None));
        assert_eq!(
            classify(&c, 503, Some("10")),
            Outcome::Retryable(Some(Pushback::After(Duration::from_secs(10))))
        );
        assert_eq!(classify(&c, 503, Some("soon")), Outcome::Retryable(None));
        // 429 with an unusable Retry-After is not retried.
        assert_eq!(classify(&c, 429, Some("99999")), Outcome::Fatal(None));
    }

    #[test]
    fn explicit_429_is_retried_without_retry_after() {
        let c = HttpStatuses::none().with(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(classify(&c, 429, None), Outcome::Retryable(None));
        assert_eq!(classify(&c, 503, None), Outcome::Success);
    }
}
