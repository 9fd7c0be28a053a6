//! `Retry-After`: `retry_after` and `retry_after_from_headers` on any
//! header value, at any `now`.
//!
//! Checked: no result above `RETRY_AFTER_MAX`; `delay-seconds` (digits, with
//! optional spaces and tabs around them) agrees with a saturating model; a valid HTTP-date
//! agrees with `httpdate`'s reading of it, measured from `now`; the header-map form agrees
//! with the plain one.

#![no_main]

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, header::RETRY_AFTER};
use libfuzzer_sys::fuzz_target;
use tower_retry_hedge::pushback::{retry_after, retry_after_from_headers};

/// Where delays saturate, as the `pushback` docs say: `u32::MAX` seconds.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(u32::MAX as u64);

fuzz_target!(|data: &[u8]| {
    // 8 bytes of `now` (seconds since the epoch, wrapped into the years 1970..=2^33 s), then
    // the header value.
    if data.len() < 8 {
        return;
    }
    let (now, value) = data.split_at(8);
    let now_secs = u64::from_le_bytes(now.try_into().unwrap_or_default()) % (1 << 33);
    let Some(now) = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(now_secs)) else {
        return;
    };
    let Ok(value) = HeaderValue::from_bytes(value) else {
        return;
    };

    let delay = retry_after(&value, now);
    if let Some(delay) = delay {
        assert!(delay <= RETRY_AFTER_MAX, "{value:?}: {delay:?}");
    }

    // The model: delay-seconds, saturating; else an HTTP-date as httpdate reads it.
    let text = std::str::from_utf8(value.as_bytes())
        .ok()
        .map(|t| t.trim_matches([' ', '\t']));
    let expected = text.and_then(|text| {
        if text.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
            if !text.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let seconds = text.bytes().fold(0u64, |acc, b| {
                acc.saturating_mul(10)
                    .saturating_add(u64::from(b - b'0'))
                    .min(u64::from(u32::MAX))
            });
            return Some(Duration::from_secs(seconds));
        }
        let date = httpdate::parse_http_date(text).ok()?;
        Some(
            date.duration_since(now)
                .unwrap_or(Duration::ZERO)
                .min(RETRY_AFTER_MAX),
        )
    });
    assert_eq!(delay, expected, "{value:?} at {now_secs}");

    let mut headers = HeaderMap::new();
    assert_eq!(retry_after_from_headers(&headers, now), None);
    headers.insert(RETRY_AFTER, value.clone());
    assert_eq!(retry_after_from_headers(&headers, now), delay);
    headers.append(RETRY_AFTER, value);
    assert_eq!(retry_after_from_headers(&headers, now), None);
});
