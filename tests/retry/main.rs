//! The retry layer against a mock service, one test per A6 rule, on tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_retry_hedge::classify::{Code, HttpStatuses};
use tower_retry_hedge::error::last_error;
use tower_retry_hedge::metadata::{AttemptInfo, Attempts};
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::throttle::Throttle;
use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};
use tower_test::mock;

mod support;

use support::*;

fn previous_attempts(request: &Req) -> Option<&str> {
    request
        .headers()
        .get("grpc-previous-rpc-attempts")
        .map(|v| v.to_str().unwrap())
}

fn attempts(response: &Res) -> Attempts {
    Attempts::of(response)
}

/// Asserts that no further attempt reaches the mock, even after a long wait.
async fn assert_no_more_attempts(handle: &mut Handle) {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        poll_request(handle).is_none(),
        "an unexpected attempt was sent"
    );
}

fn poll_request(handle: &mut Handle) -> Option<Req> {
    match handle.poll_request() {
        std::task::Poll::Ready(Some((request, _))) => Some(request),
        _ => None,
    }
}

/// A service whose attempts never answer, counting the attempts started and dropped.
#[derive(Clone, Default)]
struct Hanging {
    started: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl tower::Service<Req> for Hanging {
    type Response = Res;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Res, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        self.started.fetch_add(1, Ordering::SeqCst);
        let guard = DropCount(self.dropped.clone());
        Box::pin(async move {
            let _guard = guard;
            std::future::pending().await
        })
    }
}

fn is_deadline_exceeded(error: &BoxError) -> bool {
    let error = last_error(error);
    if error.is::<tower_retry_hedge::error::DeadlineExceeded>() {
        return true;
    }
    #[cfg(feature = "tonic")]
    if let Some(status) = error.downcast_ref::<tonic::Status>() {
        return status.code() == tonic::Code::DeadlineExceeded;
    }
    false
}

#[tokio::test(start_paused = true)]
async fn success_on_the_first_attempt_is_returned_with_one_attempt() {
    let (call, mut handle) = start(policies(policy(3)), grpc_request("hello"));
    let (request, _) = answer(&mut handle, grpc_ok()).await;
    assert_eq!(previous_attempts(&request), None);
    assert!(request.extensions().get::<AttemptInfo>().is_none());
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response), Attempts::new(1, 0));
    assert!(
        response
            .headers()
            .get("grpc-previous-rpc-attempts")
            .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn retryable_code_is_retried_with_attempt_metadata() {
    let (call, mut handle) = start(policies(policy(3)), grpc_request("hello"));
    let (first, _) = answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    let (second, _) = answer(&mut handle, grpc_ok()).await;
    assert_eq!(previous_attempts(&first), None);
    assert_eq!(previous_attempts(&second), Some("1"));
    assert_eq!(
        second.extensions().get::<AttemptInfo>(),
        Some(&AttemptInfo {
            number: 2,
            hedge: false
        })
    );
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert_eq!(
        response.headers().get("grpc-previous-rpc-attempts"),
        Some(&HeaderValue::from_static("1"))
    );
}

#[tokio::test(start_paused = true)]
async fn replayed_body_is_the_original() {
    let (call, mut handle) = start(policies(policy(3)), grpc_request("payload bytes"));
    for _ in 0..2 {
        let (request, _) = answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
        let body = http_body_util::BodyExt::collect(request.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body, "payload bytes");
    }
    let (request, _) = answer(&mut handle, grpc_ok()).await;
    let body = http_body_util::BodyExt::collect(request.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(body, "payload bytes");
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn fatal_code_is_returned_at_once() {
    let (call, mut handle) = start(policies(policy(5)), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::InvalidArgument, None)).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.headers()["grpc-status"], "3");
    assert_eq!(attempts(&response).sent(), 1);
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn max_attempts_above_the_cap_is_clamped_to_five() {
    let (call, mut handle) = start(policies(policy(10)), grpc_request("x"));
    for n in 0..5 {
        let (request, _) = answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
        let expect = (n > 0).then(|| n.to_string());
        assert_eq!(previous_attempts(&request), expect.as_deref());
    }
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(attempts(&response).sent(), 5);
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn client_cap_is_configurable() {
    let policies = Policies::builder()
        .method(METHOD, policy(10))
        .max_attempts_cap(7)
        .build();
    let (call, mut handle) = start(policies, grpc_request("x"));
    for _ in 0..7 {
        answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    }
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 7);
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_exponentially_to_its_cap() {
    let policy = RetryPolicy::builder()
        .max_attempts(5)
        .backoff(backoff(100, 300))
        .build()
        .unwrap();
    let (call, mut handle) = start(policies(policy), grpc_request("x"));
    let mut arrivals = Vec::new();
    for _ in 0..5 {
        arrivals.push(
            answer(&mut handle, trailers_only(Code::Unavailable, None))
                .await
                .1,
        );
    }
    let gaps: Vec<_> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    let ms = Duration::from_millis;
    assert_eq!(gaps, [ms(100), ms(200), ms(300), ms(300)]);
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn pushback_delays_exactly() {
    let (call, mut handle) = start(policies(policy(3)), grpc_request("x"));
    let (_, first) = answer(&mut handle, trailers_only(Code::Unavailable, Some("250"))).await;
    let (_, second) = answer(&mut handle, grpc_ok()).await;
    assert_eq!(second - first, Duration::from_millis(250));
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn pushback_zero_retries_at_once() {
    let (call, mut handle) = start(policies(policy(3)), grpc_request("x"));
    let (_, first) = answer(&mut handle, trailers_only(Code::Unavailable, Some("0"))).await;
    let (_, second) = answer(&mut handle, grpc_ok()).await;
    assert_eq!(second - first, Duration::ZERO);
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn negative_or_garbage_pushback_stops() {
    for value in ["-1", "abc", "", "99999999999"] {
        let (call, mut handle) = start(policies(policy(5)), grpc_request("x"));
        answer(&mut handle, trailers_only(Code::Unavailable, Some(value))).await;
        let response = call.await.unwrap().unwrap();
        assert_eq!(attempts(&response).sent(), 1, "pushback {value:?}");
        assert_no_more_attempts(&mut handle).await;
    }
}

#[tokio::test(start_paused = true)]
async fn pushback_on_a_fatal_code_does_not_retry() {
    let (call, mut handle) = start(policies(policy(5)), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Internal, Some("10"))).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response).sent(), 1);
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn pushback_does_not_lift_max_attempts() {
    let (call, mut handle) = start(policies(policy(2)), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Unavailable, Some("10"))).await;
    answer(&mut handle, trailers_only(Code::Unavailable, Some("10"))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 2);
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn backoff_restarts_from_initial_after_pushback() {
    let (call, mut handle) = start(policies(policy(5)), grpc_request("x"));
    let unavailable = || trailers_only(Code::Unavailable, None);
    let (_, t0) = answer(&mut handle, unavailable()).await; // backoff 100
    let (_, t1) = answer(&mut handle, unavailable()).await; // backoff 200
    let (_, t2) = answer(&mut handle, trailers_only(Code::Unavailable, Some("50"))).await;
    let (_, t3) = answer(&mut handle, unavailable()).await; // restarts: 100
    let (_, t4) = answer(&mut handle, grpc_ok()).await;
    let ms = Duration::from_millis;
    assert_eq!(
        [t1 - t0, t2 - t1, t3 - t2, t4 - t3],
        [ms(100), ms(200), ms(50), ms(100)]
    );
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn headers_without_status_commit_the_call() {
    // A response that started normally is returned as it is, whatever its trailers say.
    let (call, mut handle) = start(policies(policy(5)), grpc_request("x"));
    answer(&mut handle, grpc_ok()).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response).sent(), 1);
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn throttle_sequence_matches_grpc_core() {
    // (maxTokens 10, tokenRatio 0.1), maxAttempts 3: failing calls make 3, 2, 1, 1, 1 ...
    // attempts (tokens 10 -> 7 -> 5 -> 4 ... -> 0).
    let throttle = Throttle::new(10, 0.1).unwrap();
    let policies = Policies::builder()
        .method(METHOD, policy(3))
        .throttle(throttle.clone())
        .build();
    let mut made = Vec::new();
    for _ in 0..8 {
        let (mut call, mut handle) = start(policies.clone(), grpc_request("x"));
        let mut n = 0;
        loop {
            tokio::select! {
                Some((_, send)) = handle.next_request() => {
                    n += 1;
                    send.send_response(trailers_only(Code::Unavailable, None));
                }
                done = &mut call => { done.unwrap().unwrap(); break; }
            }
        }
        made.push(n);
    }
    assert_eq!(made, [3, 2, 1, 1, 1, 1, 1, 1]);
    assert_eq!(throttle.tokens(), 0.0);

    // Drained: 60 successes leave 6.0 tokens, and a failure takes them to 5.0: no retry.
    let succeed = |policies: Policies| async move {
        let (call, mut handle) = start(policies, grpc_request("x"));
        answer(&mut handle, grpc_ok()).await;
        call.await.unwrap().unwrap();
    };
    let failing_call_attempts = |policies: Policies| async move {
        let (mut call, mut handle) = start(policies, grpc_request("x"));
        let mut n = 0;
        loop {
            tokio::select! {
                Some((_, send)) = handle.next_request() => {
                    n += 1;
                    send.send_response(trailers_only(Code::Unavailable, None));
                }
                done = &mut call => { done.unwrap().unwrap(); break n; }
            }
        }
    };
    for _ in 0..60 {
        succeed(policies.clone()).await;
    }
    assert_eq!(failing_call_attempts(policies.clone()).await, 1);
    // Back to 0 + 61 successes = 6.1; the failure leaves 5.1 > 5: one retry.
    while throttle.tokens() > 0.0 {
        failing_call_attempts(policies.clone()).await;
    }
    for _ in 0..61 {
        succeed(policies.clone()).await;
    }
    assert_eq!(failing_call_attempts(policies.clone()).await, 2);
}

#[tokio::test(start_paused = true)]
async fn calls_without_a_policy_pass_through_and_credit_the_throttle() {
    let throttle = Throttle::new(10, 0.5).unwrap();
    let policies = Policies::builder()
        .method(METHOD, policy(3))
        .throttle(throttle.clone())
        .build();
    // Drain a little first, with a failing call that has a policy.
    let (call, mut handle) = start(policies.clone(), grpc_request("x"));
    for _ in 0..3 {
        answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    }
    call.await.unwrap().unwrap();
    assert_eq!(throttle.tokens(), 7.0);

    let request = Request::post("/test.Echo/Other")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (call, mut handle) = start(policies.clone(), request);
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    let response = call.await.unwrap().unwrap();
    assert!(response.extensions().get::<Attempts>().is_none());
    assert_eq!(
        throttle.tokens(),
        7.0,
        "no policy: a failure is not debited"
    );

    let request = Request::post("/test.Echo/Other")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (call, mut handle) = start(policies, request);
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();
    assert_eq!(throttle.tokens(), 7.5, "every successful call credits");
}

#[tokio::test(start_paused = true)]
async fn deadline_shorter_than_the_chain_ends_in_deadline_exceeded() {
    let mut request = grpc_request("x");
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("250m"));
    let started = Instant::now();
    let (call, mut handle) = start(policies(policy(5)), request);
    let (first, _) = answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    assert_eq!(first.headers()["grpc-timeout"], "250m");
    // The second attempt starts after 100 ms and carries the remaining 150 ms; it hangs.
    let (second, _send) = handle.next_request().await.unwrap();
    assert_eq!(second.headers()["grpc-timeout"], "150m");
    let error = call.await.unwrap().unwrap_err();
    assert!(is_deadline_exceeded(&error), "{error}");
    assert_eq!(Instant::now() - started, Duration::from_millis(250));
}

#[tokio::test(start_paused = true)]
async fn deadline_drops_the_attempt_in_flight() {
    let hanging = Hanging::default();
    let policy = RetryPolicy::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let svc = RetryLayer::new(policies(policy)).layer(hanging.clone());
    let error = svc.oneshot(grpc_request("x")).await.unwrap_err();
    assert!(is_deadline_exceeded(&error));
    assert_eq!(hanging.started.load(Ordering::SeqCst), 1);
    assert_eq!(hanging.dropped.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn policy_timeout_is_the_deadline_without_grpc_timeout() {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff(100, 1000))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let (call, mut handle) = start(policies(policy), grpc_request("x"));
    let (first, _send) = handle.next_request().await.unwrap();
    assert_eq!(first.headers()["grpc-timeout"], "2S");
    let error = call.await.unwrap().unwrap_err();
    assert!(is_deadline_exceeded(&error));
}

#[tokio::test(start_paused = true)]
async fn a_backoff_past_the_deadline_returns_the_last_failure_at_once() {
    let mut request = grpc_request("x");
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("50m"));
    let started = Instant::now();
    let (call, mut handle) = start(policies(policy(5)), request);
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(Instant::now(), started, "no sleep into a certain deadline");
}

#[tokio::test(start_paused = true)]
async fn cancel_during_backoff_sends_no_new_attempt() {
    let (call, mut handle) = start(policies(policy(5)), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    tokio::time::sleep(Duration::from_millis(10)).await; // inside the 100 ms backoff
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn cancel_in_flight_drops_the_attempt() {
    let hanging = Hanging::default();
    let svc = RetryLayer::new(policies(policy(5))).layer(hanging.clone());
    let call = tokio::spawn(svc.oneshot(grpc_request("x")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(hanging.started.load(Ordering::SeqCst), 1);
    assert_eq!(hanging.dropped.load(Ordering::SeqCst), 0);
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(hanging.dropped.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(hanging.started.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn with_wait_for_ready_never_sent_attempts_are_resent_transparently() {
    // maxAttempts 2, yet four attempts: two never left the client.
    let (call, mut handle) = start(policies(waiting_policy(2)), grpc_request("x"));
    for _ in 0..2 {
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    }
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    let (last, _) = answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    // One counted attempt before it: the never-sent resends are not counted (A6).
    assert_eq!(previous_attempts(&last), Some("1"));
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response), Attempts::new(4, 2));
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn never_sent_retries_are_bounded_without_a_deadline() {
    let policy = RetryPolicy::builder()
        .max_attempts(2)
        .backoff(backoff(1, 10))
        .wait_for_ready(true)
        .max_transparent_retries(3)
        .build()
        .unwrap();
    let (call, mut handle) = start(policies(policy), grpc_request("x"));
    for _ in 0..4 {
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    }
    let error = call.await.unwrap().unwrap_err();
    assert_eq!(Attempts::of_error(&*error), Attempts::new(4, 3));
    // A gRPC call that could not connect fails with UNAVAILABLE, the inner error as its
    // source, unchanged.
    let status = last_error(&error)
        .downcast_ref::<tonic::Status>()
        .expect("a gRPC status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let io = std::error::Error::source(status)
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .expect("the inner error, unchanged inside");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn transparent_retries_do_not_touch_the_throttle() {
    let throttle = Throttle::new(10, 0.1).unwrap();
    let policies = Policies::builder()
        .method(METHOD, waiting_policy(2))
        .throttle(throttle.clone())
        .build();
    let (call, mut handle) = start(policies, grpc_request("x"));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();
    assert_eq!(throttle.tokens(), 10.0);
}

#[cfg(feature = "h2")]
#[tokio::test(start_paused = true)]
async fn refused_stream_is_retried_once_at_once_then_by_policy() {
    let (call, mut handle) = start(policies(policy(2)), grpc_request("x"));
    let refused = || h2::Error::from(h2::Reason::REFUSED_STREAM);
    let (_, send) = handle.next_request().await.unwrap();
    let t0 = Instant::now();
    send.send_error(refused());
    // Once, at once, not counted.
    let (_, send) = handle.next_request().await.unwrap();
    assert_eq!(Instant::now(), t0);
    send.send_error(refused());
    // The second refusal goes to the policy: retryable (as UNAVAILABLE), after backoff.
    let (_, send) = handle.next_request().await.unwrap();
    assert_eq!(Instant::now() - t0, Duration::from_millis(100));
    send.send_error(refused());
    let error = call.await.unwrap().unwrap_err();
    assert!(last_error(&error).downcast_ref::<h2::Error>().is_some());
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through_unchanged() {
    let (call, mut handle) = start(policies(policy(2)), grpc_request("x"));
    for _ in 0..2 {
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error(std::io::Error::other("reset by peer"));
    }
    let error = call.await.unwrap().unwrap_err();
    // The inner error is kept as it is, inside the `Attempted` that counts the attempts.
    assert_eq!(last_error(&error).to_string(), "reset by peer");
    assert!(
        last_error(&error)
            .downcast_ref::<std::io::Error>()
            .is_some()
    );
    assert_eq!(Attempts::of_error(&*error).sent(), 2);
}

fn http_policies(retry_post: bool) -> Policies {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff(10, 100))
        .retryable(HttpStatuses::default())
        .retry_non_idempotent(retry_post)
        .build()
        .unwrap();
    Policies::builder()
        .route(Route::prefix("/api"), policy)
        .build()
}

fn http_response(status: u16, retry_after: Option<&'static str>) -> Res {
    let mut builder = Response::builder().status(status);
    if let Some(v) = retry_after {
        builder = builder.header("retry-after", v);
    }
    builder.body(http_body_util::Empty::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn http_503_with_retry_after_waits_that_long() {
    let request = Request::get("/api/items")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (call, mut handle) = start(http_policies(false), request);
    let (first, t0) = answer(&mut handle, http_response(503, Some("2"))).await;
    let (second, t1) = answer(&mut handle, http_response(200, None)).await;
    assert_eq!(t1 - t0, Duration::from_secs(2));
    // gRPC metadata is not added to plain HTTP requests.
    assert!(first.headers().get("grpc-previous-rpc-attempts").is_none());
    assert!(second.headers().get("grpc-previous-rpc-attempts").is_none());
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 2);
}

#[tokio::test(start_paused = true)]
async fn http_post_is_not_retried_unless_the_route_opts_in() {
    let post = || {
        Request::post("/api/items")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (call, mut handle) = start(http_policies(false), post());
    answer(&mut handle, http_response(503, None)).await;
    assert_eq!(
        call.await.unwrap().unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_no_more_attempts(&mut handle).await;

    let (call, mut handle) = start(http_policies(true), post());
    answer(&mut handle, http_response(503, None)).await;
    answer(&mut handle, http_response(201, None)).await;
    assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::CREATED);
}

#[tokio::test(start_paused = true)]
async fn http_post_that_was_never_sent_is_retried() {
    let request = Request::post("/api/items")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (call, mut handle) = start(http_policies(false), request);
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    // A 503 for the policy, counted; never having reached the server, a POST may repeat.
    answer(&mut handle, http_response(200, None)).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Attempts::new(2, 0));
}

#[tokio::test(start_paused = true)]
async fn a_never_sent_attempt_is_an_unavailable_failure_for_the_policy() {
    // gRPC's default (no wait-for-ready): counted, backed off, within maxAttempts.
    let (call, mut handle) = start(policies(policy(3)), grpc_request("x"));
    let start_at = Instant::now();
    let mut sent_at = Vec::new();
    for _ in 0..3 {
        let (request, send) = handle.next_request().await.unwrap();
        sent_at.push((
            Instant::now() - start_at,
            previous_attempts(&request).map(str::to_owned),
        ));
        send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    }
    let error = call.await.unwrap().unwrap_err();
    assert_eq!(Attempts::of_error(&*error), Attempts::new(3, 0));
    assert!(last_error(&error).is::<tonic::Status>() || last_error(&error).is::<std::io::Error>());
    assert_eq!(
        sent_at,
        [
            (Duration::ZERO, None),
            (Duration::from_millis(100), Some("1".to_owned())),
            (Duration::from_millis(300), Some("2".to_owned())),
        ]
    );
    assert_no_more_attempts(&mut handle).await;
    // Without a policy, the call fails at once.
    let other = Request::post("/test.Echo/Other")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (call, mut handle) = start(policies(policy(3)), other);
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    let error = call.await.unwrap().unwrap_err();
    assert_eq!(Attempts::of_error(&*error), Attempts::new(1, 0));
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn statistics_count_retries_and_failures_per_method() {
    let policies = policies(policy(4));
    let (call, mut handle) = start(policies.clone(), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();
    let snapshot = policies.stats().snapshot();
    let method = &snapshot.methods[METHOD];
    assert_eq!(method.retry_attempts, 2);
    assert_eq!(method.retry_failures, 1);
    assert_eq!(method.histogram, [1, 1, 0, 0, 0, 0, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn later_attempts_wait_for_the_service_to_be_ready() {
    let (mock, mut handle) = mock::pair::<Req, Res>();
    handle.allow(1);
    let svc = RetryLayer::new(policies(policy(3))).layer(mock);
    let call = tokio::spawn(svc.oneshot(grpc_request("x")));
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    // No capacity: the retry waits in poll_ready, well past its backoff.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(poll_request(&mut handle).is_none());
    handle.allow(1);
    answer(&mut handle, grpc_ok()).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 2);
}

#[tokio::test(start_paused = true)]
async fn pushback_above_the_client_cap_stops_instead_of_parking_the_call() {
    let throttle = Throttle::new(10, 0.1).unwrap();
    let policies = Policies::builder()
        .method(METHOD, policy(5))
        .throttle(throttle.clone())
        .max_pushback(Duration::from_secs(1))
        .build();
    // 2147483647 ms is 24.8 days: a server must not be able to park a call that long.
    let (call, mut handle) = start(policies.clone(), grpc_request("x"));
    let started = Instant::now();
    answer(
        &mut handle,
        trailers_only(Code::Unavailable, Some("2147483647")),
    )
    .await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response).sent(), 1);
    assert_eq!(Instant::now(), started);
    assert_eq!(throttle.tokens(), 9.0, "counted as a do-not-retry pushback");
    assert_no_more_attempts(&mut handle).await;

    // At the cap, the delay is honoured exactly.
    let (call, mut handle) = start(policies, grpc_request("x"));
    let (_, first) = answer(&mut handle, trailers_only(Code::Unavailable, Some("1000"))).await;
    let (_, second) = answer(&mut handle, grpc_ok()).await;
    assert_eq!(second - first, Duration::from_secs(1));
    call.await.unwrap().unwrap();
}

/// A service whose clones each remember whether they were polled ready, like a tower
/// `Buffer` (a tonic `Channel`): a clone starts cold, its first `poll_ready` costs (here,
/// counted), and calling a clone that is not ready is a bug.
struct ReadyTracked {
    ready: bool,
    warmed_up: bool,
    cold_polls: Arc<AtomicUsize>,
    answers: Arc<std::sync::Mutex<std::collections::VecDeque<Res>>>,
}

impl Clone for ReadyTracked {
    fn clone(&self) -> Self {
        ReadyTracked {
            ready: false,
            warmed_up: false,
            cold_polls: self.cold_polls.clone(),
            answers: self.answers.clone(),
        }
    }
}

impl tower::Service<Req> for ReadyTracked {
    type Response = Res;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Res, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        if !self.warmed_up {
            self.warmed_up = true;
            self.cold_polls.fetch_add(1, Ordering::SeqCst);
        }
        self.ready = true;
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        let answer = self.answers.lock().unwrap().pop_front();
        std::future::ready(Ok(answer.unwrap_or_else(grpc_ok)))
    }
}

#[tokio::test(start_paused = true)]
async fn the_ready_service_stays_in_the_layer_and_calls_retry_on_a_clone() {
    let cold_polls = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let inner = ReadyTracked {
        ready: false,
        warmed_up: false,
        cold_polls: cold_polls.clone(),
        answers: answers.clone(),
    };
    let mut svc = RetryLayer::new(policies(policy(3))).layer(inner);
    // Ten successful calls on one layer: only the layer's own service is ever warmed up.
    for _ in 0..10 {
        let response = svc.ready().await.unwrap().call(grpc_request("x")).await;
        assert_eq!(attempts(&response.unwrap()).sent(), 1);
    }
    assert_eq!(cold_polls.load(Ordering::SeqCst), 1);
    // A retry goes to the call's clone, which is polled ready before it is called.
    answers
        .lock()
        .unwrap()
        .push_back(trailers_only(Code::Unavailable, None));
    let response = svc.ready().await.unwrap().call(grpc_request("x")).await;
    assert_eq!(attempts(&response.unwrap()).sent(), 2);
    assert_eq!(cold_polls.load(Ordering::SeqCst), 2);
}

fn assert_unpin<T: Unpin>(_: &T) {}

#[test]
fn response_futures_are_unpin_when_the_inner_future_is() {
    let inner = ReadyTracked {
        ready: true,
        warmed_up: true,
        cold_polls: Arc::default(),
        answers: Arc::default(),
    };
    let mut retry = RetryLayer::new(policies(policy(3))).layer(inner.clone());
    // A clone starts unready; the layer calls its service as `poll_ready` left it.
    retry.get_mut().ready = true;
    assert_unpin(&retry.call(grpc_request("x")));
    let hedge_policies = Policies::builder()
        .method(
            METHOD,
            tower_retry_hedge::HedgePolicy::builder()
                .delay(Duration::ZERO)
                .build()
                .unwrap(),
        )
        .build();
    let mut hedge = tower_retry_hedge::HedgeLayer::new(hedge_policies).layer(inner);
    hedge.get_mut().ready = true;
    assert_unpin(&hedge.call(grpc_request("x")));
}

#[cfg(feature = "h2")]
#[tokio::test(start_paused = true)]
async fn calls_without_a_policy_pass_through_when_transparent_retries_are_off() {
    let other = || {
        Request::post("/test.Echo/Other")
            .header("content-type", "application/grpc")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    for transparent in [true, false] {
        let policies = Policies::builder()
            .method(METHOD, policy(3))
            .transparent_retries(transparent)
            .build();
        let (call, mut handle) = start(policies, other());
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error(h2::Error::from(h2::Reason::REFUSED_STREAM));
        if transparent {
            // A6's default: a stream refused before the server's application saw it is sent
            // again, once.
            answer(&mut handle, grpc_ok()).await;
            let response = call.await.unwrap().unwrap();
            assert_eq!(attempts(&response), Attempts::new(2, 1));
        } else {
            // Off: the call is the service's own, error and all.
            let error = call.await.unwrap().unwrap_err();
            assert!(error.downcast_ref::<h2::Error>().is_some(), "{error}");
        }
        assert_no_more_attempts(&mut handle).await;
    }
}

/// A body whose copies break the [`Copies`] contract: no copy for a second attempt, and yet
/// no reader it says it committed to.
struct Uncopyable(Full<Bytes>);

impl http_body::Body for Uncopyable {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.0).poll_frame(cx)
    }
}

struct FirstOnly {
    bytes: Bytes,
    /// How often a copy was asked for.
    asked: Arc<AtomicUsize>,
}

impl tower_retry_hedge::body::Copies<Uncopyable> for FirstOnly {
    fn first(&self) -> (Uncopyable, u64) {
        (Uncopyable(Full::new(self.bytes.clone())), 0)
    }

    fn copy(&self) -> Option<(Uncopyable, u64)> {
        let asked = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        // A driver that asks again at once spins inside one poll: fail rather than hang.
        assert!(asked < 100, "a copy was asked for {asked} times");
        None
    }

    fn is_committed(&self) -> bool {
        false
    }

    fn committed_reader(&self) -> Option<u64> {
        None
    }

    fn commit(&self, _: u64) -> bool {
        true
    }

    fn poll_committed(&self, _: &mut std::task::Context<'_>) -> std::task::Poll<u64> {
        std::task::Poll::Pending
    }
}

thread_local! {
    /// Where the copies of the test's body count the copies asked for.
    static ASKED: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(0));
}

impl tower_retry_hedge::body::Replay for Uncopyable {
    type Copies = FirstOnly;

    fn prepare(self, _: &tower_retry_hedge::body::BufferLimits) -> Result<FirstOnly, Uncopyable> {
        Ok(FirstOnly {
            bytes: Bytes::from_static(b"once"),
            asked: ASKED.with(Arc::clone),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_that_gives_no_copy_and_names_no_reader_ends_the_call_instead_of_spinning() {
    let sent = Arc::new(AtomicUsize::new(0));
    let service = tower::service_fn({
        let sent = Arc::clone(&sent);
        move |_: Request<Uncopyable>| {
            sent.fetch_add(1, Ordering::SeqCst);
            async {
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, BoxError>(response)
            }
        }
    });
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .retryable(HttpStatuses::default())
        .build()
        .unwrap();
    let policies = Policies::builder()
        .route(Route::prefix("/"), policy)
        .build();
    let mut client = RetryLayer::new(policies).layer(service);
    // PUT: idempotent, so its failure may be retried.
    let request = Request::put("http://test/upload")
        .body(Uncopyable(Full::new(Bytes::from_static(b"once"))))
        .unwrap();

    // Before the fix, the driver asked the body for a copy, got none, and asked again at once,
    // forever, inside one poll: the call never returned.
    let response = client.ready().await.unwrap().call(request).await.unwrap();

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "no second attempt without a copy"
    );
    assert_eq!(ASKED.with(|asked| asked.load(Ordering::SeqCst)), 1);
}
