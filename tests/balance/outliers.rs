//! Outlier detection in `balance::Balance` over mock endpoints, on the paused clock: what
//! counts as a failure (a Trailers-Only status, the trailers of a begun gRPC response, HTTP
//! 5xx and 429, an endpoint's error), and what the balancer does with it under the retry
//! layer: a dead backend stops drawing attempts, comes back when its time is up, and a set that
//! fails everywhere is not ejected for good.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::time::Instant;
use tower::discover::{Change, ServiceList};
use tower::load::{CompleteOnResponse, PendingRequests};
use tower::util::BoxService;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::balance::{Balance, EjectionReason, OutlierDetection};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy, Throttle};

use super::{Req, SERVICE, balanced, ms, request};

/// A streamed response body: data, then trailers.
type Streamed = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// How a streaming backend answers: a begun gRPC response whose trailers hold `status`.
fn trailers_backend(
    status: &'static str,
) -> PendingRequests<BoxService<Req, http::Response<Streamed>, Infallible>> {
    let service = tower::service_fn(move |_: Req| async move {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static(status));
        let frames = vec![
            Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
            Ok(Frame::trailers(trailers)),
        ];
        let response = http::Response::builder()
            .header("content-type", "application/grpc")
            .body(StreamBody::new(stream::iter(frames)))
            .expect("valid response");
        Ok::<_, Infallible>(response)
    });
    PendingRequests::new(BoxService::new(service), CompleteOnResponse::default())
}

/// Outlier detection that ejects on a run of three failures and on nothing else, for 30 s.
fn three_in_a_row() -> OutlierDetection {
    OutlierDetection::builder()
        .consecutive_failures(Some(3))
        .failure_percentage(None)
        .build()
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn a_failure_in_the_trailers_counts_once_the_body_is_read() {
    let mut balance = Balance::with_seed(
        ServiceList::new(vec![
            trailers_backend("14"),
            trailers_backend("0"),
            trailers_backend("0"),
        ]),
        3,
    )
    .outlier_detection(three_in_a_row());
    let outliers = balance.outliers();
    // Bodies dropped unread count for nothing: the caller gave up, not the backend.
    for _ in 0..30 {
        let response = balance.ready().await.unwrap().call(request(None)).await;
        drop(response.expect("answered"));
    }
    balance.ready().await.unwrap();
    assert_eq!(outliers.ejections(), 0);
    // Read to their trailers, the failures of backend 0 count, and eject it.
    for _ in 0..30 {
        let response = balance.ready().await.unwrap().call(request(None)).await;
        let body = response.expect("answered").into_body();
        let collected = body.collect().await.expect("the body");
        assert!(collected.trailers().is_some());
    }
    balance.ready().await.unwrap();
    let ejected = outliers.ejected();
    assert_eq!(ejected.len(), 1, "{ejected:?}");
    assert_eq!(ejected[0].key, "0", "ServiceList keys are indices");
    assert_eq!(ejected[0].reason, EjectionReason::ConsecutiveFailures);
}

/// A backend answering `status` (HTTP) with no gRPC status, or failing when `status` is 0,
/// or failing as h2 fails the calls of a connection its own reset guard closed when
/// `status` is 1.
fn http_backend(
    status: u16,
) -> PendingRequests<BoxService<Req, http::Response<http_body_util::Empty<bytes::Bytes>>, BoxError>>
{
    let service = tower::service_fn(move |_: Req| async move {
        if status == 0 {
            return Err::<http::Response<http_body_util::Empty<bytes::Bytes>>, BoxError>(
                "connection reset".into(),
            );
        }
        if status == 1 {
            let closed = r#"connection error detected: detected excessive load generating behavior (b"too_many_internal_resets")"#;
            return Err(closed.into());
        }
        Ok(http::Response::builder()
            .status(status)
            .body(http_body_util::Empty::new())
            .expect("valid response"))
    });
    PendingRequests::new(BoxService::new(service), CompleteOnResponse::default())
}

#[tokio::test(start_paused = true)]
async fn http_5xx_429_and_errors_count_as_failures_4xx_and_reset_guards_do_not() {
    // A connection an HTTP/2 reset guard closed (`1`) is the client's doing, not the
    // backend's.
    for (status, fails) in [
        (503, true),
        (500, true),
        (429, true),
        (0, true),
        (404, false),
        (1, false),
    ] {
        let mut balance = Balance::with_seed(
            ServiceList::new(vec![
                http_backend(status),
                http_backend(200),
                http_backend(200),
            ]),
            5,
        )
        .outlier_detection(three_in_a_row());
        let outliers = balance.outliers();
        for _ in 0..60 {
            let _ = balance.ready().await.unwrap().call(request(None)).await;
        }
        balance.ready().await.unwrap();
        assert_eq!(outliers.ejections() == 1, fails, "status {status}");
    }
}

/// The gRPC status a backend answers with, by the time since the start.
type Status = fn(Duration) -> &'static str;

/// A backend answering with the gRPC status `status(now)` after 1 ms, noting its first
/// attempts (requests without `grpc-previous-rpc-attempts`) and when.
fn timed_backend(
    name: &'static str,
    status: Status,
    start: Instant,
    first: &Arc<Mutex<Vec<(&'static str, Instant)>>>,
) -> PendingRequests<BoxService<Req, http::Response<http_body_util::Empty<bytes::Bytes>>, Infallible>>
{
    let first = Arc::clone(first);
    let service = tower::service_fn(move |request: Req| {
        if !request.headers().contains_key("grpc-previous-rpc-attempts") {
            first
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((name, Instant::now()));
        }
        let code = status(Instant::now() - start);
        async move {
            tokio::time::sleep(ms(1)).await;
            let response = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", code)
                .body(http_body_util::Empty::new())
                .expect("valid response");
            Ok::<_, Infallible>(response)
        }
    });
    PendingRequests::new(BoxService::new(service), CompleteOnResponse::default())
}

/// Calls one after another, one every `every`, until `until` after `start`, through the retry
/// layer (3 attempts, 1 ms backoff, `throttle`) over a balancer of `a`, `b`, `c`; the failed
/// calls by when they started.
async fn calls_over(
    backends: [(&'static str, Status); 3],
    detection: OutlierDetection,
    throttle: Option<Throttle>,
    every: Duration,
    until: Duration,
) -> (Vec<Duration>, Vec<(&'static str, Duration)>) {
    let start = Instant::now();
    let first = Arc::new(Mutex::new(Vec::new()));
    let balanced = balanced(
        backends
            .iter()
            .map(|&(name, status)| (name, timed_backend(name, status, start, &first)))
            .collect(),
        detection,
    );
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Exponential::new(ms(1), ms(1), 2.0, Jitter::None).expect("valid backoff"))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("valid policy");
    let mut policies = Policies::builder()
        .service(SERVICE, policy)
        .track_backends(true);
    if let Some(throttle) = throttle {
        policies = policies.throttle(throttle);
    }
    let service = RetryLayer::new(policies.build()).layer(balanced);
    let mut failed = Vec::new();
    let mut ticks = tokio::time::interval(every);
    while Instant::now() - start < until {
        ticks.tick().await;
        let started = Instant::now() - start;
        let response = service
            .clone()
            .oneshot(request(None))
            .await
            .expect("answered");
        if response.headers()["grpc-status"] != "0" {
            failed.push(started);
        }
    }
    let first = first
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|&(name, at)| (name, at - start))
        .collect();
    (failed, first)
}

fn ok(_: Duration) -> &'static str {
    "0"
}

fn dead(_: Duration) -> &'static str {
    "14"
}

/// The first attempts each backend took between `from` and `to`.
fn shares(
    first: &[(&'static str, Duration)],
    from: Duration,
    to: Duration,
) -> HashMap<&'static str, usize> {
    let mut counts = HashMap::new();
    for &(name, at) in first {
        if (from..to).contains(&at) {
            *counts.entry(name).or_default() += 1;
        }
    }
    counts
}

#[tokio::test(start_paused = true)]
async fn under_the_quick_start_throttle_a_dead_backend_stops_drawing_first_attempts() {
    let (failed, first) = calls_over(
        [("dead", dead), ("a", ok), ("b", ok)],
        OutlierDetection::default(),
        Some(Throttle::new(10, 0.1).expect("valid throttle")),
        ms(5),
        Duration::from_secs(10),
    )
    .await;
    assert!(failed.is_empty(), "{failed:?}");
    let counts = shares(&first, Duration::ZERO, Duration::from_secs(10));
    // Five failures in a row, and it is out for the remaining 10 s (its ejection lasts 30).
    assert_eq!(counts.get("dead"), Some(&5), "{counts:?}");
    // Without outlier detection it takes a third of them, and the throttle fails calls.
    let (failed, first) = calls_over(
        [("dead", dead), ("a", ok), ("b", ok)],
        OutlierDetection::disabled(),
        Some(Throttle::new(10, 0.1).expect("valid throttle")),
        ms(5),
        Duration::from_secs(10),
    )
    .await;
    let counts = shares(&first, Duration::ZERO, Duration::from_secs(10));
    assert!(counts["dead"] > 400, "{counts:?}");
    assert!(failed.len() > 100, "{} failed", failed.len());
}

fn dead_for_5_s(since_start: Duration) -> &'static str {
    if since_start < Duration::from_secs(5) {
        "14"
    } else {
        "0"
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_recovers_gets_its_share_back_after_its_ejection() {
    // Ejected at once, for 10 s; it recovers at 5 s; back at 10 s, it answers well and has
    // its full share: a third from 20 s, twice its ejection time.
    let detection = OutlierDetection::builder()
        .base_ejection_time(Duration::from_secs(10))
        .build()
        .expect("valid settings");
    let (failed, first) = calls_over(
        [("flaky", dead_for_5_s), ("a", ok), ("b", ok)],
        detection,
        None,
        ms(10),
        Duration::from_secs(40),
    )
    .await;
    assert!(failed.is_empty(), "{failed:?}");
    let out = shares(&first, Duration::from_secs(1), Duration::from_secs(10));
    assert_eq!(out.get("flaky"), None, "ejected: {out:?}");
    let back = shares(&first, Duration::from_secs(20), Duration::from_secs(40));
    let total: usize = back.values().sum();
    let share = back["flaky"] as f64 / total as f64;
    assert!((0.28..0.39).contains(&share), "{share:.3}: {back:?}");
}

fn everyone_down_for_20_s(since_start: Duration) -> &'static str {
    if since_start < Duration::from_secs(20) {
        "14"
    } else {
        "0"
    }
}

#[tokio::test(start_paused = true)]
async fn when_every_backend_fails_nobody_is_ejected_for_good() {
    let (failed, first) = calls_over(
        [
            ("a", everyone_down_for_20_s),
            ("b", everyone_down_for_20_s),
            ("c", everyone_down_for_20_s),
        ],
        OutlierDetection::default(),
        None,
        ms(10),
        Duration::from_secs(400),
    )
    .await;
    // Every call fails while they are all down, none after.
    assert!(failed.iter().all(|&at| at < Duration::from_secs(20)));
    assert!(failed.len() > 1_500, "{}", failed.len());
    // While all fail, every backend keeps taking first attempts (one at most is out at a
    // time, for the failure percentage of an interval).
    let down = shares(&first, Duration::ZERO, Duration::from_secs(20));
    assert_eq!(down.len(), 3, "{down:?}");
    // Once the longest ejection (300 s) is over, all three share the calls.
    let late = shares(&first, Duration::from_secs(330), Duration::from_secs(400));
    let total: usize = late.values().sum();
    for name in ["a", "b", "c"] {
        let share = late.get(name).copied().unwrap_or(0) as f64 / total as f64;
        assert!((0.25..0.42).contains(&share), "{name}: {late:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_removed_while_ejected_is_forgotten_and_one_inserted_again_is_known() {
    let (changes, receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut balance = Balance::with_seed(
        tokio_stream::wrappers::UnboundedReceiverStream::new(receiver),
        9,
    )
    .outlier_detection(three_in_a_row());
    let outliers = balance.outliers();
    for (name, status) in [("a", 503), ("b", 200), ("c", 200)] {
        changes
            .send(Ok::<_, Infallible>(Change::Insert(
                name,
                http_backend(status),
            )))
            .expect("the balancer holds the stream");
    }
    for _ in 0..60 {
        let _ = balance.ready().await.unwrap().call(request(None)).await;
    }
    balance.ready().await.unwrap();
    assert_eq!(outliers.ejected().len(), 1);
    // Inserted again under its key: still out.
    changes
        .send(Ok(Change::Insert("a", http_backend(503))))
        .expect("the balancer holds the stream");
    balance.ready().await.unwrap();
    assert_eq!(outliers.ejected().len(), 1);
    // Removed: forgotten.
    changes
        .send(Ok(Change::Remove("a")))
        .expect("the balancer holds the stream");
    balance.ready().await.unwrap();
    assert!(outliers.ejected().is_empty());
    assert_eq!(balance.len(), 2);
}
