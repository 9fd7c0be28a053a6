//! `google.rpc.RetryInfo`: the retry delay Google APIs send inside `grpc-status-details-bin`.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use http::{HeaderMap, HeaderName};
use prost::Message as _;

use super::{AttemptResult, Classify, GrpcCodes, Outcome};
use crate::pushback::Pushback;

/// The header that carries a serialized `google.rpc.Status` (base64, as every `-bin`
/// metadata value).
pub(crate) const GRPC_STATUS_DETAILS_BIN: HeaderName =
    HeaderName::from_static("grpc-status-details-bin");

/// The longest `grpc-status-details-bin` value read, in bytes of base64 (6 KiB once decoded);
/// a longer one is ignored unread. A `RetryInfo` takes a few dozen bytes; the bound keeps a
/// hostile server from making the client decode a large message on every failure.
pub(crate) const MAX_STATUS_DETAILS_LEN: usize = 8 * 1024;

/// The type name of `RetryInfo` in a `google.protobuf.Any`'s URL.
const RETRY_INFO_TYPE: &str = "google.rpc.RetryInfo";

/// gRPC binary metadata is standard base64, with or without padding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The `retry_delay` of the first `google.rpc.RetryInfo` in a `grpc-status-details-bin`
/// value (the header's bytes, base64).
///
/// `None` for anything else: a value longer than 8 KiB, bad base64, a
/// message that is not a `google.rpc.Status`, no `RetryInfo` among its details, a `RetryInfo`
/// without a delay, or a delay that is negative or not a valid protobuf `Duration`. Never
/// panics. The delay is not capped here: the layers apply their pushback cap
/// ([`PoliciesBuilder::max_pushback`](crate::policy::PoliciesBuilder::max_pushback)).
pub(crate) fn retry_info_delay(value: &[u8]) -> Option<Duration> {
    if value.len() > MAX_STATUS_DETAILS_LEN {
        return None;
    }
    let bytes = BASE64.decode(value).ok()?;
    let status = tonic_types::pb::Status::decode(bytes.as_slice()).ok()?;
    status
        .details
        .iter()
        .filter(|any| any.type_url.rsplit('/').next() == Some(RETRY_INFO_TYPE))
        .find_map(|any| {
            let info = tonic_types::pb::RetryInfo::decode(any.value.as_slice()).ok()?;
            let delay = info.retry_delay?;
            // A protobuf Duration: nanos in [0, 1e9) for a non-negative one.
            let seconds = u64::try_from(delay.seconds).ok()?;
            let nanos = u32::try_from(delay.nanos)
                .ok()
                .filter(|n| *n < 1_000_000_000)?;
            Some(Duration::new(seconds, nanos))
        })
}

/// The `RetryInfo` delay of a response's headers: the `retry_delay` of the first
/// `google.rpc.RetryInfo` in its one `grpc-status-details-bin` value (base64).
///
/// `None` if there is no such value, or more than one, and for anything else: a value longer
/// than 8 KiB, bad base64, a message that is not a `google.rpc.Status`, no `RetryInfo` among
/// its details, a `RetryInfo` without a delay, or a delay that is negative or not a valid
/// protobuf `Duration`. Never panics. The delay is not capped here: the layers apply their
/// pushback cap ([`PoliciesBuilder::max_pushback`](crate::policy::PoliciesBuilder::max_pushback)).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue};
/// use tower_retry_hedge::classify::retry_info_from_headers;
///
/// // google.rpc.Status { code: 14, details: [Any { RetryInfo { retry_delay: 0.3 s } }] }
/// let value = "CA4aNAoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIICgYQgMaGjwE";
/// let mut headers = HeaderMap::new();
/// headers.insert("grpc-status-details-bin", HeaderValue::from_static(value));
/// assert_eq!(retry_info_from_headers(&headers), Some(Duration::from_millis(300)));
///
/// headers.insert("grpc-status-details-bin", HeaderValue::from_static("not base64!"));
/// assert_eq!(retry_info_from_headers(&headers), None);
/// ```
pub fn retry_info_from_headers(headers: &HeaderMap) -> Option<Duration> {
    let mut values = headers.get_all(GRPC_STATUS_DETAILS_BIN).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    retry_info_delay(value.as_bytes())
}

/// A classifier that reads `google.rpc.RetryInfo` as pushback: what its inner classifier
/// calls [`Outcome::Retryable`] without a pushback gets the `RetryInfo` delay from
/// `grpc-status-details-bin`, if the response carries one.
///
/// Google APIs send their retry delay this way rather than in `grpc-retry-pushback-ms`;
/// google-cloud-cpp and the Bigtable Java client honour it. A `grpc-retry-pushback-ms` value
/// (which the inner classifier reads) wins over it. The delay is then handled as any other
/// pushback: the next attempt is sent exactly that much later, the backoff restarts, and a
/// delay over the layers' cap
/// ([`max_pushback`](crate::policy::PoliciesBuilder::max_pushback)) stops the retries. A
/// value that cannot be read is ignored, and the backoff applies.
///
/// Made with [`GrpcCodes::with_retry_info`], or [`WithRetryInfo::new`] around any classifier.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use tower_retry_hedge::classify::{AttemptResult, Classify, Code, GrpcCodes, Outcome};
/// use tower_retry_hedge::pushback::Pushback;
///
/// let classifier = GrpcCodes::from([Code::Unavailable]).with_retry_info();
/// let mut headers = HeaderMap::new();
/// headers.insert("grpc-status", HeaderValue::from_static("14"));
/// headers.insert(
///     "grpc-status-details-bin",
///     HeaderValue::from_static(
///         "CA4aNAoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIICgYQgMaGjwE",
///     ),
/// );
/// let outcome = classifier.classify(AttemptResult::Response { status: StatusCode::OK, headers: &headers });
/// assert_eq!(outcome, Outcome::Retryable(Some(Pushback::After(Duration::from_millis(300)))));
/// ```
#[derive(Clone, Copy)]
#[cfg_attr(docsrs, doc(cfg(feature = "retry-info")))]
pub struct WithRetryInfo<C> {
    inner: C,
}

impl<C> WithRetryInfo<C> {
    /// `inner`, with `RetryInfo` read as pushback for its retryable outcomes.
    pub fn new(inner: C) -> Self {
        WithRetryInfo { inner }
    }

    /// The inner classifier.
    pub fn get_ref(&self) -> &C {
        &self.inner
    }
}

impl<C: fmt::Debug> fmt::Debug for WithRetryInfo<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WithRetryInfo").field(&self.inner).finish()
    }
}

impl<C: Classify> Classify for WithRetryInfo<C> {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        let outcome = self.inner.classify(result);
        match (outcome, result) {
            (Outcome::Retryable(None), AttemptResult::Response { headers, .. }) => {
                match retry_info_from_headers(headers) {
                    Some(delay) => Outcome::Retryable(Some(Pushback::After(delay))),
                    None => outcome,
                }
            }
            _ => outcome,
        }
    }
}

impl GrpcCodes {
    /// This set, reading `google.rpc.RetryInfo` from `grpc-status-details-bin` as pushback
    /// (see [`WithRetryInfo`]).
    #[cfg_attr(docsrs, doc(cfg(feature = "retry-info")))]
    pub fn with_retry_info(self) -> WithRetryInfo<GrpcCodes> {
        WithRetryInfo::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Code;
    use http::{HeaderValue, StatusCode};
    use tonic_types::{ErrorDetails, StatusExt as _};

    /// The headers of a Trailers-Only `status` as tonic's server sends them.
    fn headers_of(status: tonic::Status) -> HeaderMap {
        status.into_http::<()>().into_parts().0.headers
    }

    fn unavailable_with(details: ErrorDetails) -> HeaderMap {
        headers_of(tonic::Status::with_error_details(
            tonic::Code::Unavailable,
            "try later",
            details,
        ))
    }

    fn classify(classifier: &impl Classify, headers: &HeaderMap) -> Outcome {
        classifier.classify(AttemptResult::Response {
            status: StatusCode::OK,
            headers,
        })
    }

    fn details_value(headers: &HeaderMap) -> Vec<u8> {
        headers[&GRPC_STATUS_DETAILS_BIN].as_bytes().to_vec()
    }

    #[test]
    fn reads_the_delay_tonic_types_writes() {
        for delay in [
            Duration::ZERO,
            Duration::from_millis(300),
            Duration::new(7, 1),
            Duration::from_secs(86_400),
        ] {
            let headers = unavailable_with(ErrorDetails::with_retry_info(Some(delay)));
            assert_eq!(retry_info_from_headers(&headers), Some(delay), "{delay:?}");
            assert_eq!(
                classify(
                    &GrpcCodes::from([Code::Unavailable]).with_retry_info(),
                    &headers
                ),
                Outcome::Retryable(Some(Pushback::After(delay)))
            );
        }
    }

    #[test]
    fn finds_retry_info_among_other_details() {
        let mut details = ErrorDetails::with_error_info("RATE_LIMITED", "example.com", []);
        details.set_retry_info(Some(Duration::from_millis(1500)));
        details.set_debug_info(vec!["frame".to_string()], "detail");
        let headers = unavailable_with(details);
        assert_eq!(
            retry_info_from_headers(&headers),
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn nothing_to_read_leaves_the_outcome_alone() {
        let codes = GrpcCodes::from([Code::Unavailable]);
        let classifier = codes.with_retry_info();
        // No details, details without RetryInfo, RetryInfo without a delay.
        for headers in [
            headers_of(tonic::Status::unavailable("down")),
            unavailable_with(ErrorDetails::with_debug_info(
                vec!["frame".to_string()],
                "detail",
            )),
            unavailable_with(ErrorDetails::with_retry_info(None)),
        ] {
            assert_eq!(retry_info_from_headers(&headers), None);
            assert_eq!(classify(&classifier, &headers), classify(&codes, &headers));
        }
    }

    #[test]
    fn only_retryable_outcomes_take_the_delay() {
        let classifier = GrpcCodes::from([Code::Unavailable]).with_retry_info();
        let details = || ErrorDetails::with_retry_info(Some(Duration::from_millis(300)));
        let fatal = headers_of(tonic::Status::with_error_details(
            tonic::Code::InvalidArgument,
            "no",
            details(),
        ));
        assert_eq!(classify(&classifier, &fatal), Outcome::Fatal(None));

        // `grpc-retry-pushback-ms` wins over RetryInfo.
        let mut headers = unavailable_with(details());
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from_static("50"));
        assert_eq!(
            classify(&classifier, &headers),
            Outcome::Retryable(Some(Pushback::After(Duration::from_millis(50))))
        );

        let error = std::io::Error::other("reset");
        assert_eq!(
            classifier.classify(AttemptResult::Error(&error)),
            Outcome::Retryable(None)
        );
    }

    #[test]
    fn padded_and_unpadded_base64_are_read() {
        let mut needed_padding = 0;
        // Nanos of 0, 1, 2 and 3 varint bytes: messages of different lengths.
        for nanos in [0, 1, 200, 20_000] {
            let delay = Duration::new(1, nanos);
            let unpadded = details_value(&unavailable_with(ErrorDetails::with_retry_info(Some(
                delay,
            ))));
            let mut padded = unpadded.clone();
            while !padded.len().is_multiple_of(4) {
                padded.push(b'=');
            }
            needed_padding += usize::from(padded != unpadded);
            assert_eq!(retry_info_delay(&padded), Some(delay));
            assert_eq!(retry_info_delay(&unpadded), Some(delay));
        }
        assert!(
            needed_padding > 0,
            "no value needed padding: both forms untested"
        );
    }

    #[test]
    fn garbage_is_ignored() {
        let good = details_value(&unavailable_with(ErrorDetails::with_retry_info(Some(
            Duration::from_secs(1),
        ))));
        let mut cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"!!!!".to_vec(),
            b"AAAA".to_vec(),
            vec![b'A'; MAX_STATUS_DETAILS_LEN + 4],
            good[..good.len() / 2].to_vec(),
        ];
        // Every truncation and every flipped byte of a good value: no panic.
        for end in 0..good.len() {
            cases.push(good[..end].to_vec());
        }
        for i in 0..good.len() {
            let mut flipped = good.clone();
            flipped[i] ^= 0x20;
            cases.push(flipped);
        }
        for case in &cases {
            let _ = retry_info_delay(case);
        }
        for case in &cases[..5] {
            assert_eq!(retry_info_delay(case), None, "{case:?}");
        }
        // Over the size bound, even a valid value is not read.
        let mut long = good.clone();
        long.resize(MAX_STATUS_DETAILS_LEN + 1, b'=');
        assert_eq!(retry_info_delay(&long), None);
    }

    #[test]
    fn negative_and_invalid_durations_are_ignored() {
        let encode = |seconds: i64, nanos: i32| {
            let info = tonic_types::pb::RetryInfo {
                retry_delay: Some(prost_types_duration(seconds, nanos)),
            };
            let status = tonic_types::pb::Status {
                code: 14,
                message: String::new(),
                details: vec![any("type.googleapis.com/google.rpc.RetryInfo", info)],
            };
            BASE64.encode(status.encode_to_vec())
        };
        assert_eq!(
            retry_info_delay(encode(1, 500_000_000).as_bytes()),
            Some(Duration::from_millis(1500))
        );
        for (seconds, nanos) in [(-1, 0), (0, -1), (1, 1_000_000_000), (i64::MIN, i32::MIN)] {
            assert_eq!(retry_info_delay(encode(seconds, nanos).as_bytes()), None);
        }
        // The largest protobuf Duration is read (and left to the layers' cap).
        assert_eq!(
            retry_info_delay(encode(315_576_000_000, 999_999_999).as_bytes()),
            Some(Duration::new(315_576_000_000, 999_999_999))
        );
    }

    #[test]
    fn other_hosts_in_the_type_url_are_accepted_other_types_are_not() {
        let info = tonic_types::pb::RetryInfo {
            retry_delay: Some(prost_types_duration(3, 0)),
        };
        let with_url = |url: &str| {
            let status = tonic_types::pb::Status {
                code: 14,
                message: String::new(),
                details: vec![any(url, info)],
            };
            retry_info_delay(BASE64.encode(status.encode_to_vec()).as_bytes())
        };
        assert_eq!(
            with_url("example.com/google.rpc.RetryInfo"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            with_url("google.rpc.RetryInfo"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(with_url("type.googleapis.com/google.rpc.DebugInfo"), None);
        assert_eq!(with_url("type.googleapis.com/google.rpc.RetryInfoX"), None);
    }

    #[test]
    fn several_header_values_are_ignored() {
        let headers = unavailable_with(ErrorDetails::with_retry_info(Some(Duration::from_secs(1))));
        let mut twice = headers.clone();
        twice.append(
            GRPC_STATUS_DETAILS_BIN,
            headers[&GRPC_STATUS_DETAILS_BIN].clone(),
        );
        assert_eq!(retry_info_from_headers(&twice), None);
    }

    fn prost_types_duration(seconds: i64, nanos: i32) -> prost_types::Duration {
        prost_types::Duration { seconds, nanos }
    }

    fn any(type_url: &str, info: tonic_types::pb::RetryInfo) -> prost_types::Any {
        prost_types::Any {
            type_url: type_url.to_string(),
            value: info.encode_to_vec(),
        }
    }
}
