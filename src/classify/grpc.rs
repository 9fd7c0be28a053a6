//! The gRPC classifier: retryable status codes from Trailers-Only responses.

use http::{HeaderMap, HeaderValue, StatusCode};

use super::{AttemptResult, Classify, Code, GrpcCodes, Outcome, transport_outcome};
use crate::pushback::grpc_pushback;

/// The gRPC status of a response, if it has one in its headers (a Trailers-Only response),
/// or the status the gRPC HTTP mapping gives a non-200 response without one.
///
/// Returns `None` for a 200 response without `grpc-status`: the server has started a normal
/// response whose status will come in the trailers, so the call is committed.
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_retry_hedge::classify::{grpc_status, Code};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(grpc_status(StatusCode::OK, &headers), None);
/// assert_eq!(grpc_status(StatusCode::SERVICE_UNAVAILABLE, &headers), Some(Code::Unavailable));
/// headers.insert("grpc-status", HeaderValue::from_static("8"));
/// assert_eq!(grpc_status(StatusCode::OK, &headers), Some(Code::ResourceExhausted));
/// ```
pub fn grpc_status(status: StatusCode, headers: &HeaderMap) -> Option<Code> {
    if let Some(code) = header_status(headers) {
        return Some(code);
    }
    if status == StatusCode::OK {
        return None;
    }
    // https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md
    Some(match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    })
}

/// The status in a `grpc-status` header, if there is one: the status of a Trailers-Only
/// response, or a response's trailers. Every reader of answers in the crate (the layers'
/// classifiers and the balancer's health) reads it here.
pub(crate) fn header_status(headers: &HeaderMap) -> Option<Code> {
    // A constant name: a `&str` key would be parsed and checked on every lookup.
    const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
    let value = headers.get(&GRPC_STATUS)?;
    // An unparseable status is UNKNOWN, as the gRPC HTTP/2 protocol says.
    Some(Code::from_header_bytes(value.as_bytes()).unwrap_or(Code::Unknown))
}

/// Whether a `content-type` is gRPC's: `application/grpc`, or `application/grpc+<codec>` or
/// with parameters after `;`. The layers test requests with it, the balancer responses.
pub(crate) fn is_grpc_content_type(value: Option<&HeaderValue>) -> bool {
    value.is_some_and(|v| {
        let v = v.as_bytes();
        v.starts_with(b"application/grpc") && matches!(v.get(16), None | Some(b'+') | Some(b';'))
    })
}

/// A set of gRPC codes classifies attempts: a code in the set is retryable (or, for a hedging
/// policy, non-fatal), `OK` and committed responses are successes, any other code is fatal.
///
/// A transport error is first checked for [`Outcome::NotSent`] / [`Outcome::Refused`]; any
/// other error counts as `UNAVAILABLE`, which is what a gRPC client reports for a broken
/// connection.
impl Classify for GrpcCodes {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        let (code, pushback) = match result {
            AttemptResult::Response { status, headers } => match grpc_status(status, headers) {
                None | Some(Code::Ok) => return Outcome::Success,
                Some(code) => (code, grpc_pushback(headers)),
            },
            AttemptResult::Error(error) => match transport_outcome(error) {
                Some(outcome) => return outcome,
                None => (Code::Unavailable, None),
            },
            AttemptResult::Status { code: Code::Ok, .. } => return Outcome::Success,
            AttemptResult::Status { code, pushback } => (code, pushback),
        };
        if self.contains(code) {
            Outcome::Retryable(pushback)
        } else {
            Outcome::Fatal(pushback)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pushback::Pushback;
    use http::HeaderValue;
    use std::time::Duration;

    fn trailers_only(code: &'static str, pushback: Option<&'static str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static(code));
        if let Some(p) = pushback {
            headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static(p));
        }
        headers
    }

    fn classify(codes: GrpcCodes, headers: &HeaderMap) -> Outcome {
        codes.classify(AttemptResult::Response {
            status: StatusCode::OK,
            headers,
        })
    }

    #[test]
    fn trailers_only_codes() {
        let codes = GrpcCodes::from([Code::Unavailable]);
        assert_eq!(classify(codes, &trailers_only("0", None)), Outcome::Success);
        assert_eq!(
            classify(codes, &trailers_only("14", None)),
            Outcome::Retryable(None)
        );
        assert_eq!(
            classify(codes, &trailers_only("13", None)),
            Outcome::Fatal(None)
        );
        // Garbage in grpc-status is UNKNOWN, which is not in the set.
        assert_eq!(
            classify(codes, &trailers_only("banana", None)),
            Outcome::Fatal(None)
        );
    }

    #[test]
    fn pushback_travels_with_the_outcome() {
        let codes = GrpcCodes::from([Code::Unavailable]);
        assert_eq!(
            classify(codes, &trailers_only("14", Some("250"))),
            Outcome::Retryable(Some(Pushback::After(Duration::from_millis(250))))
        );
        assert_eq!(
            classify(codes, &trailers_only("3", Some("-1"))),
            Outcome::Fatal(Some(Pushback::Stop))
        );
    }

    /// A status given without headers reads as the same status in a Trailers-Only response.
    #[test]
    fn a_status_without_headers_reads_as_its_trailers_only_response() {
        let codes = GrpcCodes::from([Code::Unavailable]);
        let pushback = Some(Pushback::After(Duration::from_millis(250)));
        for (code, pushback, header, header_pushback) in [
            (Code::Ok, None, "0", None),
            (Code::Unavailable, None, "14", None),
            (Code::Unavailable, pushback, "14", Some("250")),
            (Code::Internal, Some(Pushback::Stop), "13", Some("-1")),
        ] {
            let status = codes.classify(AttemptResult::Status { code, pushback });
            let response = classify(codes, &trailers_only(header, header_pushback));
            assert_eq!(status, response, "{code:?}");
        }
    }

    #[test]
    fn headers_without_status_commit() {
        let codes = GrpcCodes::from([Code::Unavailable]);
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        assert_eq!(classify(codes, &headers), Outcome::Success);
    }

    #[test]
    fn http_statuses_map_to_codes() {
        let codes = GrpcCodes::from([Code::Unavailable]);
        let headers = HeaderMap::new();
        for (status, expect) in [
            (503, Outcome::Retryable(None)),
            (429, Outcome::Retryable(None)),
            (404, Outcome::Fatal(None)),
            (500, Outcome::Fatal(None)),
        ] {
            let outcome = codes.classify(AttemptResult::Response {
                status: StatusCode::from_u16(status).unwrap(),
                headers: &headers,
            });
            assert_eq!(outcome, expect, "{status}");
        }
    }

    #[test]
    fn plain_errors_count_as_unavailable() {
        let error = std::io::Error::other("connection reset");
        let retry_unavailable = GrpcCodes::from([Code::Unavailable]);
        let retry_nothing = GrpcCodes::from([Code::Aborted]);
        assert_eq!(
            retry_unavailable.classify(AttemptResult::Error(&error)),
            Outcome::Retryable(None)
        );
        assert_eq!(
            retry_nothing.classify(AttemptResult::Error(&error)),
            Outcome::Fatal(None)
        );
    }
}
