//! `grpc-status-details-bin`: `retry_info_from_headers` on any value, and on the base64 of
//! any bytes (so that the protobuf decoder sees arbitrary messages, not only what survives
//! base64), and `GrpcCodes::with_retry_info` on a Trailers-Only response carrying the value.
//!
//! Checked besides "no panic": a value over 8 KiB (the documented limit) is never read;
//! padding does not change the result; the classifier's pushback is exactly the delay read,
//! and only for a retryable code.

#![no_main]

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower_retry_hedge::classify::{
    AttemptResult, Classify, Code, GrpcCodes, Outcome, retry_info_from_headers,
};
use tower_retry_hedge::pushback::Pushback;

const GRPC_STATUS_DETAILS_BIN: &str = "grpc-status-details-bin";
const MAX_STATUS_DETAILS_LEN: usize = 8 * 1024;

/// The delay read from a response whose one details header is `value`.
fn retry_info_delay(value: &[u8]) -> Option<std::time::Duration> {
    let mut headers = HeaderMap::new();
    headers.insert(GRPC_STATUS_DETAILS_BIN, HeaderValue::from_bytes(value).ok()?);
    retry_info_from_headers(&headers)
}

fuzz_target!(|data: &[u8]| {
    // The first byte says how to use the rest: as the header's bytes, or as the message
    // (then base64-encoded, unpadded or padded), and which status code answers.
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let value = match mode % 3 {
        0 => rest.to_vec(),
        1 => STANDARD_NO_PAD.encode(rest).into_bytes(),
        _ => STANDARD.encode(rest).into_bytes(),
    };
    let delay = retry_info_delay(&value);
    if value.len() > MAX_STATUS_DETAILS_LEN {
        assert_eq!(delay, None);
    }
    if mode % 3 != 0 && value.len() <= MAX_STATUS_DETAILS_LEN - 2 {
        // The same message with the other padding reads the same.
        let other = if mode % 3 == 1 {
            STANDARD.encode(rest)
        } else {
            STANDARD_NO_PAD.encode(rest)
        };
        assert_eq!(retry_info_delay(other.as_bytes()), delay);
    }

    let Ok(header) = HeaderValue::from_bytes(&value) else {
        return;
    };
    let retryable = mode & 0x80 == 0;
    let mut headers = HeaderMap::new();
    headers.insert(
        "grpc-status",
        HeaderValue::from_static(if retryable { "14" } else { "3" }),
    );
    headers.insert(GRPC_STATUS_DETAILS_BIN, header);
    let outcome = GrpcCodes::from([Code::Unavailable])
        .with_retry_info()
        .classify(AttemptResult::Response {
            status: StatusCode::OK,
            headers: &headers,
        });
    let expected = match (retryable, delay) {
        (true, Some(delay)) => Outcome::Retryable(Some(Pushback::After(delay))),
        (true, None) => Outcome::Retryable(None),
        (false, _) => Outcome::Fatal(None),
    };
    assert_eq!(outcome, expected);
});
