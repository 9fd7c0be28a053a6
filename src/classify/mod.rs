//! Turning one attempt's result into an [`Outcome`].
//!
//! A retry or hedge layer sends an attempt, gets back `Result<Response, Error>`, and must
//! decide: return it, try again, or give up. That decision is a [`Classify`]. It sees the
//! response's status and headers, or the error itself (not a string: callers can downcast
//! it and tell a refused connection from a reset), and answers with an [`Outcome`]:
//!
//! | outcome | retry layer | hedge layer | throttle |
//! |---|---|---|---|
//! | [`Outcome::Success`] | return it | return it, cancel the others | credit |
//! | [`Outcome::Retryable`] | retry per policy | send the next hedge now | debit |
//! | [`Outcome::Fatal`] | return it | return it, cancel the others | — |
//! | [`Outcome::NotSent`] | an `UNAVAILABLE` failure for the policy; with wait-for-ready, resent until the deadline | the same | debit (none when resent) |
//! | [`Outcome::Refused`] | retry once, at once | retry once, at once | — |
//!
//! Built-in classifiers:
//!
//! - [`GrpcCodes`]: a set of retryable (or, for hedging, non-fatal) gRPC status codes, read
//!   from the `grpc-status` header of a Trailers-Only response; `grpc-retry-pushback-ms` is
//!   read as pushback. A response with ordinary headers (a body follows) is a success for
//!   classification: the call is committed.
//! - [`HttpStatuses`]: retryable HTTP statuses (502, 503, 504, and 429 when it carries
//!   `Retry-After`), with `Retry-After` as pushback.
//! - Any closure `Fn(AttemptResult<'_>) -> Outcome`.
//!
//! Errors are first checked by [`transport_outcome`]: an error that proves the request never
//! left the client is [`Outcome::NotSent`], an HTTP/2 `REFUSED_STREAM` or a `GOAWAY` that did
//! not process the stream is [`Outcome::Refused`]. A refused stream is resent once at once,
//! even for a method whose policy would not retry, since the server's application never saw
//! it. A request that never left is, as gRPC has it, an `UNAVAILABLE` failure for the
//! method's policy (retried whatever the HTTP method), or, with wait-for-ready, resent until
//! the deadline.
//!
//! # Examples
//!
//! The default gRPC classifier: `UNAVAILABLE` is retryable, everything else is final.
//!
//! ```
//! use http::{HeaderMap, HeaderValue, StatusCode};
//! use tower_retry_hedge::classify::{AttemptResult, Classify, Code, GrpcCodes, Outcome};
//! use tower_retry_hedge::pushback::Pushback;
//!
//! let codes = GrpcCodes::from([Code::Unavailable]);
//! let mut headers = HeaderMap::new();
//! headers.insert("grpc-status", HeaderValue::from_static("14"));
//! headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("250"));
//! let outcome = codes.classify(AttemptResult::Response { status: StatusCode::OK, headers: &headers });
//! assert_eq!(
//!     outcome,
//!     Outcome::Retryable(Some(Pushback::After(std::time::Duration::from_millis(250))))
//! );
//! ```
//!
//! A custom classifier from a closure: retry HTTP 500 as well, but only on `GET`-style
//! routes where the policy allows it.
//!
//! ```
//! use tower_retry_hedge::classify::{AttemptResult, Classify, HttpStatuses, Outcome};
//!
//! let statuses = HttpStatuses::default().with(http::StatusCode::INTERNAL_SERVER_ERROR);
//! let custom = move |result: AttemptResult<'_>| match result {
//!     AttemptResult::Error(_) => Outcome::Fatal(None),
//!     other => statuses.classify(other),
//! };
//! let headers = http::HeaderMap::new();
//! let outcome = custom.classify(AttemptResult::Response {
//!     status: http::StatusCode::INTERNAL_SERVER_ERROR,
//!     headers: &headers,
//! });
//! assert_eq!(outcome, Outcome::Retryable(None));
//! ```

mod code;
mod errors;
mod grpc;
mod http;
#[cfg(feature = "retry-info")]
mod retry_info;

use std::error::Error;
use std::fmt;

pub use self::code::{Code, GrpcCodes, UnknownCode};
pub use self::errors::transport_outcome;
pub use self::grpc::grpc_status;
pub(crate) use self::grpc::{header_status, is_grpc_content_type};
pub use self::http::{HttpStatuses, ResetFormat, ResetHeader};
#[cfg(feature = "retry-info")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry-info")))]
pub use self::retry_info::{WithRetryInfo, retry_info_from_headers};
use crate::pushback::Pushback;

/// What one attempt produced, as a classifier sees it.
///
/// More kinds of result may come: a classifier matches the ones it knows and gives the rest
/// an outcome of its own (`_ =>`).
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum AttemptResult<'a> {
    /// The service answered with a response.
    Response {
        /// The response's HTTP status.
        status: ::http::StatusCode,
        /// The response's headers (for a gRPC Trailers-Only response, these hold
        /// `grpc-status`).
        headers: &'a ::http::HeaderMap,
    },
    /// The service failed; the error is passed as it is so that it can be downcast.
    Error(&'a (dyn Error + Send + Sync + 'static)),
    /// A gRPC call ended with a status and no HTTP response to read it from: a
    /// Trailers-Only answer through the `grpc` crate's interceptor, or an attempt that never
    /// reached the server's application, which A6 counts as `UNAVAILABLE`.
    Status {
        /// The status code.
        code: Code,
        /// The server's pushback (`grpc-retry-pushback-ms`), if it sent any.
        pushback: Option<Pushback>,
    },
}

impl fmt::Debug for AttemptResult<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptResult::Response { status, .. } => {
                f.debug_struct("Response").field("status", status).finish()
            }
            AttemptResult::Error(error) => {
                f.debug_tuple("Error").field(&error.to_string()).finish()
            }
            AttemptResult::Status { code, pushback } => f
                .debug_struct("Status")
                .field("code", code)
                .field("pushback", pushback)
                .finish(),
        }
    }
}

/// The class of one attempt's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A good answer, or a response that commits the call (headers with a body to follow).
    Success,
    /// A failure the policy may retry (a retryable or non-fatal code), with the server's
    /// pushback if it sent one.
    Retryable(Option<Pushback>),
    /// A failure that must be returned as it is. A pushback "stop" carried by it still counts
    /// against the throttle, as A6 says.
    Fatal(Option<Pushback>),
    /// The request never left the client (for example, the connection could not be made).
    NotSent,
    /// The request reached the server but not its application (HTTP/2 `REFUSED_STREAM`, or a
    /// `GOAWAY` that did not process the stream).
    Refused,
}

impl Outcome {
    /// The pushback the server sent, if any.
    pub fn pushback(&self) -> Option<Pushback> {
        match *self {
            Outcome::Retryable(pushback) | Outcome::Fatal(pushback) => pushback,
            _ => None,
        }
    }

    /// The outcome with a pushback delay above `max` turned into "do not retry".
    ///
    /// A6 asks for the server's delay exactly, so a delay too long to wait is no reason to
    /// retry sooner: the layers stop instead (see
    /// [`PoliciesBuilder::max_pushback`](crate::policy::PoliciesBuilder::max_pushback)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::classify::Outcome;
    /// use tower_retry_hedge::pushback::Pushback;
    ///
    /// let long = Outcome::Retryable(Some(Pushback::After(Duration::from_secs(3600))));
    /// assert_eq!(
    ///     long.cap_pushback(Duration::from_secs(60)),
    ///     Outcome::Retryable(Some(Pushback::Stop))
    /// );
    /// ```
    #[must_use]
    pub fn cap_pushback(self, max: std::time::Duration) -> Outcome {
        match self {
            Outcome::Retryable(Some(Pushback::After(delay))) if delay > max => {
                Outcome::Retryable(Some(Pushback::Stop))
            }
            Outcome::Fatal(Some(Pushback::After(delay))) if delay > max => {
                Outcome::Fatal(Some(Pushback::Stop))
            }
            other => other,
        }
    }

    /// A short lower-case name for logs and tracing fields.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Retryable(_) => "retryable",
            Outcome::Fatal(_) => "fatal",
            Outcome::NotSent => "not sent",
            Outcome::Refused => "refused",
        }
    }
}

/// Classifies the result of one attempt.
///
/// Implemented by [`GrpcCodes`], [`HttpStatuses`] and by closures
/// `Fn(AttemptResult<'_>) -> Outcome`. The trait is object safe: policies hold an
/// `Arc<dyn Classify>`.
pub trait Classify: Send + Sync + 'static {
    /// Classifies one attempt.
    fn classify(&self, result: AttemptResult<'_>) -> Outcome;
}

impl<F> Classify for F
where
    F: Fn(AttemptResult<'_>) -> Outcome + Send + Sync + 'static,
{
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        self(result)
    }
}

impl Classify for std::sync::Arc<dyn Classify> {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        (**self).classify(result)
    }
}

impl Classify for Box<dyn Classify> {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        (**self).classify(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_is_object_safe() {
        let boxed: Box<dyn Classify> = Box::new(GrpcCodes::from([Code::Unavailable]));
        let headers = ::http::HeaderMap::new();
        let outcome = boxed.classify(AttemptResult::Response {
            status: ::http::StatusCode::OK,
            headers: &headers,
        });
        assert_eq!(outcome, Outcome::Success);
    }
}
