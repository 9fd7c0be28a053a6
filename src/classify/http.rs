//! The HTTP classifier: retryable statuses, `Retry-After` and rate-limit reset headers as
//! pushback.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, StatusCode, header::RETRY_AFTER};
use rand::Rng;

use super::{AttemptResult, Classify, Code, Outcome, transport_outcome};
use crate::pushback::{Pushback, retry_after};

/// Retryable HTTP statuses, with `Retry-After` read as pushback.
///
/// By default 502, 503 and 504 are retryable, and 429 when it carries a `Retry-After` the
/// client can honour (a 429 without one says "not now" without saying when, so retrying at
/// backoff speed would only add to the overload). A `Retry-After` above
/// [`max_retry_after`](HttpStatuses::max_retry_after) (default 30 s) is ignored and the
/// backoff applies, so a hostile or broken server cannot park a call.
///
/// Where the server says when to come back is configurable ([`reset_headers`]): by default
/// `Retry-After` alone; rate-limited APIs add `X-RateLimit-Reset` (seconds or a Unix time) or
/// `x-amz-retry-after` (milliseconds). Headers are tried in order, as Envoy's
/// `rate_limited_retry_back_off` does. [`retry_after_jitter`] spreads the clients that were
/// told the same instant over `U(d, 1.5·d)`, so they do not all return at the reset.
///
/// `425 Too Early` means the server did not process the request: it is
/// [`Outcome::Refused`], retried once at once even for `POST`. Errors that prove the request
/// was never sent, or refused before processing, are [`Outcome::NotSent`] /
/// [`Outcome::Refused`]; other errors are retryable (the policy's idempotency gate keeps
/// non-idempotent methods from being retried after them).
///
/// [`reset_headers`]: HttpStatuses::reset_headers
/// [`retry_after_jitter`]: HttpStatuses::retry_after_jitter
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
    reset_headers: Vec<ResetHeader>,
    jitter: bool,
}

/// How a rate-limit reset header encodes its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetFormat {
    /// `Retry-After`: delay-seconds or an HTTP-date.
    RetryAfter,
    /// A delay in whole seconds.
    Seconds,
    /// A delay in whole milliseconds (`x-amz-retry-after`).
    Millis,
    /// A Unix time in seconds.
    UnixTime,
    /// Seconds, or a Unix time when the value is that large (at least 1 000 000 000, which is
    /// 2001 as a time and 31 years as a delay): `X-RateLimit-Reset` is sent both ways.
    SecondsOrUnixTime,
}

/// A header that tells when to retry: its name and how it encodes the time.
///
/// ```
/// use tower_retry_hedge::classify::{HttpStatuses, ResetFormat, ResetHeader};
///
/// let classifier = HttpStatuses::default().reset_headers([
///     ResetHeader::retry_after(),
///     ResetHeader::new("x-ratelimit-reset", ResetFormat::SecondsOrUnixTime),
///     ResetHeader::new("x-amz-retry-after", ResetFormat::Millis),
/// ]);
/// # let _ = classifier;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetHeader {
    name: HeaderName,
    format: ResetFormat,
}

impl ResetHeader {
    /// `name`, read as `format`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name: it is the programmer's constant, not input.
    pub fn new(name: &'static str, format: ResetFormat) -> ResetHeader {
        ResetHeader {
            name: HeaderName::from_static(name),
            format,
        }
    }

    /// `Retry-After`, in either of its forms.
    pub fn retry_after() -> ResetHeader {
        ResetHeader {
            name: RETRY_AFTER,
            format: ResetFormat::RetryAfter,
        }
    }

    fn delay(&self, headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
        let mut values = headers.get_all(&self.name).iter();
        let value = values.next()?;
        if values.next().is_some() {
            // Several values disagree, or repeat: trust none.
            return None;
        }
        let integer = || -> Option<u64> {
            let text = value.to_str().ok()?.trim_matches([' ', '\t']);
            if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            text.parse().ok()
        };
        let until = |unix: u64| {
            let now = now.duration_since(UNIX_EPOCH).ok()?;
            Some(Duration::from_secs(unix).saturating_sub(now))
        };
        match self.format {
            ResetFormat::RetryAfter => retry_after(value, now),
            ResetFormat::Seconds => integer().map(Duration::from_secs),
            ResetFormat::Millis => integer().map(Duration::from_millis),
            ResetFormat::UnixTime => until(integer()?),
            ResetFormat::SecondsOrUnixTime => {
                let n = integer()?;
                if n >= 1_000_000_000 {
                    until(n)
                } else {
                    Some(Duration::from_secs(n))
                }
            }
        }
    }
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
            reset_headers: vec![ResetHeader::retry_after()],
            jitter: false,
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

    /// The headers that tell when to retry, tried in order; the first that parses wins.
    /// Default: `Retry-After` alone.
    #[must_use]
    pub fn reset_headers(mut self, headers: impl IntoIterator<Item = ResetHeader>) -> Self {
        self.reset_headers = headers.into_iter().collect();
        self
    }

    /// Spreads a server's delay `d` over `U(d, 1.5·d)` (never past
    /// [`max_retry_after`](HttpStatuses::max_retry_after)), so that the clients told the same
    /// reset instant do not all come back at it. Off by default.
    #[must_use]
    pub fn retry_after_jitter(mut self, enabled: bool) -> Self {
        self.jitter = enabled;
        self
    }

    /// The server's delay, from the first reset header that parses; a delay above the cap
    /// yields `None`, so the backoff applies.
    fn pushback(&self, headers: &HeaderMap) -> Option<Pushback> {
        let now = SystemTime::now();
        let delay = self
            .reset_headers
            .iter()
            .find_map(|header| header.delay(headers, now))?;
        if delay > self.max_retry_after {
            return None;
        }
        let delay = if self.jitter && !delay.is_zero() {
            let extra = rand::rng().random_range(0..=delay.as_nanos() as u64 / 2);
            (delay + Duration::from_nanos(extra)).min(self.max_retry_after)
        } else {
            delay
        };
        Some(Pushback::After(delay))
    }
}

impl Classify for HttpStatuses {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        match result {
            AttemptResult::Response { status, headers } => {
                if status == StatusCode::TOO_EARLY {
                    return Outcome::Refused;
                }
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
            // Read as the HTTP status that gRPC's mapping gives the code.
            AttemptResult::Status { code, pushback } => {
                if self.retryable.contains(&http_status_of(code)) {
                    Outcome::Retryable(pushback)
                } else {
                    Outcome::Success
                }
            }
        }
    }
}

/// The HTTP status of a gRPC code, as gRPC's HTTP mapping (`grpc_status`) reads them back:
/// `UNAVAILABLE` is a 503, `RESOURCE_EXHAUSTED` a 429, and any other failure a 500.
fn http_status_of(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_FOUND,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
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

    fn with_header(c: &HttpStatuses, status: u16, name: &'static str, value: &str) -> Outcome {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        c.classify(AttemptResult::Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers: &headers,
        })
    }

    #[test]
    fn reset_headers_are_tried_in_order() {
        let c = HttpStatuses::default().reset_headers([
            ResetHeader::new("x-amz-retry-after", ResetFormat::Millis),
            ResetHeader::new("x-ratelimit-reset", ResetFormat::SecondsOrUnixTime),
        ]);
        let after = |d| Outcome::Retryable(Some(Pushback::After(d)));
        assert_eq!(
            with_header(&c, 503, "x-amz-retry-after", "1500"),
            after(Duration::from_millis(1500))
        );
        assert_eq!(
            with_header(&c, 503, "x-ratelimit-reset", "7"),
            after(Duration::from_secs(7))
        );
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 20;
        let Outcome::Retryable(Some(Pushback::After(d))) =
            with_header(&c, 503, "x-ratelimit-reset", &unix.to_string())
        else {
            panic!("a Unix time is pushback");
        };
        assert!(
            d > Duration::from_secs(18) && d <= Duration::from_secs(20),
            "{d:?}"
        );
        // Retry-After is not in this list: ignored.
        assert_eq!(
            with_header(&c, 503, "retry-after", "3"),
            Outcome::Retryable(None)
        );
        // Above the cap: the backoff applies.
        assert_eq!(
            with_header(&c, 503, "x-amz-retry-after", "31000"),
            Outcome::Retryable(None)
        );
        assert_eq!(
            with_header(&c, 503, "x-amz-retry-after", "-5"),
            Outcome::Retryable(None)
        );
    }

    #[test]
    fn jitter_spreads_over_one_and_a_half() {
        let c = HttpStatuses::default().retry_after_jitter(true);
        let mut seen_above = false;
        for _ in 0..200 {
            let Outcome::Retryable(Some(Pushback::After(d))) = classify(&c, 503, Some("4")) else {
                panic!("pushback expected");
            };
            assert!(
                d >= Duration::from_secs(4) && d <= Duration::from_secs(6),
                "{d:?}"
            );
            seen_above |= d > Duration::from_millis(4500);
        }
        assert!(seen_above);
        // Never past the cap.
        let c = c.max_retry_after(Duration::from_secs(4));
        assert_eq!(
            classify(&c, 503, Some("4")),
            Outcome::Retryable(Some(Pushback::After(Duration::from_secs(4))))
        );
    }

    /// A gRPC status reads as the HTTP status gRPC's mapping gives it.
    #[test]
    fn a_grpc_status_reads_as_its_http_status() {
        let statuses = HttpStatuses::default();
        let status = |code| {
            statuses.classify(AttemptResult::Status {
                code,
                pushback: None,
            })
        };
        assert_eq!(status(Code::Ok), Outcome::Success);
        assert_eq!(status(Code::Unavailable), Outcome::Retryable(None));
        assert_eq!(status(Code::InvalidArgument), Outcome::Success);
        for code in (0..17).filter_map(Code::from_i32) {
            let mapped = crate::classify::grpc_status(http_status_of(code), &HeaderMap::new());
            assert_eq!(mapped.unwrap_or(Code::Ok), code_read_back(code), "{code:?}");
        }
    }

    /// What gRPC's HTTP mapping reads back from the status `http_status_of` gives.
    fn code_read_back(code: Code) -> Code {
        match code {
            Code::Ok
            | Code::Unavailable
            | Code::Unimplemented
            | Code::Unauthenticated
            | Code::PermissionDenied => code,
            Code::ResourceExhausted => Code::Unavailable,
            _ => Code::Unknown,
        }
    }

    #[test]
    fn too_early_is_refused() {
        assert_eq!(
            classify(&HttpStatuses::default(), 425, None),
            Outcome::Refused
        );
    }

    #[test]
    fn explicit_429_is_retried_without_retry_after() {
        let c = HttpStatuses::none().with(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(classify(&c, 429, None), Outcome::Retryable(None));
        assert_eq!(classify(&c, 503, None), Outcome::Success);
    }
}
