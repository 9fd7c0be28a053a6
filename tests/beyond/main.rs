//! Beyond A6: per-attempt timeouts, hedging on them, retry budgets, rate-limit headers,
//! Idempotency-Key, 425, and the on_retry hook. Mock services on tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{Code, GrpcCodes, HttpStatuses, ResetFormat, ResetHeader};
use tower_retry_hedge::error::{AttemptTimedOut, last_error};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::policy::{RetryDecision, Route};
use tower_retry_hedge::throttle::{AdaptiveThrottle, RetryBudget, RetryThrottle, ThrottleRegistry};
use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};

type Req = Request<Full<Bytes>>;
/// The body carries the number of the attempt that answered.
type Res = Response<String>;

/// A service whose n-th attempt (from 0) answers `status` after `latency`, both chosen by a
/// script; it counts attempts started and attempts dropped before answering.
/// What attempt n does: its latency, status and response headers.
type Script = dyn Fn(u32) -> (Duration, u16, Vec<(&'static str, String)>) + Send + Sync;

#[derive(Clone)]
struct Scripted {
    script: Arc<Script>,
    started: Arc<AtomicU32>,
    cancelled: Arc<AtomicU32>,
}

impl Scripted {
    fn new(
        script: impl Fn(u32) -> (Duration, u16, Vec<(&'static str, String)>) + Send + Sync + 'static,
    ) -> Self {
        Scripted {
            script: Arc::new(script),
            started: Arc::default(),
            cancelled: Arc::default(),
        }
    }

    fn started(&self) -> u32 {
        self.started.load(Ordering::SeqCst)
    }

    fn cancelled(&self) -> u32 {
        self.cancelled.load(Ordering::SeqCst)
    }
}

struct CancelGuard(Option<Arc<AtomicU32>>);

impl CancelGuard {
    /// The attempt answered: dropping it now is no cancellation.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(counter) = self.0.take() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl tower::Service<Req> for Scripted {
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
        let n = self.started.fetch_add(1, Ordering::SeqCst);
        let (latency, status, headers) = (self.script)(n);
        let mut guard = CancelGuard(Some(self.cancelled.clone()));
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            guard.disarm();
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            Ok(response.body(n.to_string()).unwrap())
        })
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fixed_backoff(delay: Duration) -> Exponential {
    Exponential::new(delay, delay, 1.0, Jitter::None).unwrap()
}

fn http_policy() -> tower_retry_hedge::policy::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_attempts(4)
        .backoff(fixed_backoff(ms(10)))
        .retryable(HttpStatuses::default())
}

fn layer(policy: RetryPolicy) -> RetryLayer {
    RetryLayer::new(
        Policies::builder()
            .route(Route::prefix("/"), policy)
            .build(),
    )
}

fn get() -> Req {
    Request::get("/items")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn post() -> Req {
    Request::post("/items")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn per_attempt_timeout_cancels_and_retries() {
    // Attempt 0 would take 1 s; the per-attempt timeout of 100 ms cancels it.
    let svc = Scripted::new(|n| (if n == 0 { ms(1000) } else { ms(5) }, 200, vec![]));
    let policy = http_policy().per_attempt_timeout(ms(100)).build().unwrap();
    let started = Instant::now();
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.body(), "1");
    assert_eq!(svc.cancelled(), 1);
    // 100 ms timeout + 10 ms backoff + 5 ms answer.
    assert_eq!(started.elapsed(), ms(115));
}

#[tokio::test(start_paused = true)]
async fn per_attempt_timeouts_end_with_attempt_timed_out() {
    let svc = Scripted::new(|_| (ms(1000), 200, vec![]));
    let policy = http_policy().per_attempt_timeout(ms(100)).build().unwrap();
    let error = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap_err();
    // A call of several attempts returns its last error inside an `Attempted`.
    assert!(last_error(&error).is::<AttemptTimedOut>(), "{error}");
    assert_eq!(Attempts::of_error(&*error).sent(), 4);
    assert_eq!(svc.started(), 4);
    assert_eq!(svc.cancelled(), 4);
}

#[tokio::test(start_paused = true)]
async fn hedge_on_per_attempt_timeout_keeps_the_slow_attempt() {
    // Attempt 0 answers at 300 ms; attempt 1 (sent at 100 ms) would take 1 s.
    let svc = Scripted::new(|n| (if n == 0 { ms(300) } else { ms(1000) }, 200, vec![]));
    let policy = http_policy()
        .per_attempt_timeout(ms(100))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .unwrap();
    let started = Instant::now();
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.body(), "0", "the first attempt, left running, won");
    assert_eq!(started.elapsed(), ms(300));
    // Attempts at 0, 100, 200 ms; the two later ones were cancelled when the first won.
    assert_eq!(svc.started(), 3);
    assert_eq!(svc.cancelled(), 2);
    assert_eq!(Attempts::of(&response).sent(), 3);
}

#[tokio::test(start_paused = true)]
async fn hedge_on_per_attempt_timeout_waits_for_slow_attempts_after_the_last_failure() {
    // Attempt 0 is slow but good (400 ms); attempts 1..3 fail fast with 503.
    let svc = Scripted::new(|n| {
        if n == 0 {
            (ms(400), 200, vec![])
        } else {
            (ms(1), 503, vec![])
        }
    });
    let policy = http_policy()
        .max_attempts(2)
        .per_attempt_timeout(ms(100))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .unwrap();
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body(), "0");
    assert_eq!(svc.started(), 2);
}

#[tokio::test(start_paused = true)]
async fn retry_budget_caps_retries_in_a_failure_burst() {
    // Every call fails. Budget: 20 % of calls, no floor: 100 calls make at most 20 retries.
    let svc = Scripted::new(|_| (ms(1), 503, vec![]));
    let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.2).unwrap();
    let policy = http_policy().build().unwrap();
    let policies = Policies::builder()
        .route(Route::prefix("/"), policy)
        .throttle(budget.clone())
        .build();
    let svc = RetryLayer::new(policies).layer(svc.clone());
    let mut attempts = 0;
    for _ in 0..100 {
        let response = svc.clone().oneshot(get()).await.unwrap();
        attempts += Attempts::of(&response).sent();
    }
    assert_eq!(attempts, 120, "100 calls + 20 retries");
    assert_eq!(budget.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn adaptive_throttle_per_authority_sheds_retries_to_the_failing_host_only() {
    // `down.test` answers 503 to everything, `up.test` 200.
    let seen = Arc::new(AtomicU32::new(0));
    let counter = seen.clone();
    let svc = tower::service_fn(move |request: Req| {
        counter.fetch_add(1, Ordering::SeqCst);
        let status = if request.uri().host() == Some("down.test") {
            503
        } else {
            200
        };
        async move {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let registry = ThrottleRegistry::from_template(AdaptiveThrottle::default().with_seed(3));
    let policies = Policies::builder()
        .route(Route::prefix("/"), http_policy().build().unwrap())
        .throttle_per_authority(registry.clone())
        .build();
    let svc = RetryLayer::new(policies).layer(svc);
    let call = |uri: &'static str| {
        let svc = svc.clone();
        async move {
            let request = Request::get(uri).body(Full::new(Bytes::new())).unwrap();
            let response = svc.oneshot(request).await.unwrap();
            (response.status(), Attempts::of(&response).sent())
        }
    };

    let mut attempts = 0;
    for _ in 0..50 {
        let (status, sent) = call("http://down.test/items").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        attempts += sent;
    }
    let down = registry.get("down.test");
    // Every attempt's answer was counted against the host, none accepted.
    assert_eq!(down.requests(), u64::from(attempts));
    assert_eq!(down.accepts(), 0);
    // Without a throttle 50 calls make 200 attempts; with no accepts, almost every retry
    // after the first few failures is rejected.
    assert!(attempts < 50 + 20, "{attempts} attempts");
    assert!(down.rejection_probability() > 0.95);
    assert_eq!(seen.load(Ordering::SeqCst), attempts);

    // The other host has a throttle of its own, untouched by the failures.
    assert_eq!(registry.get("up.test").requests(), 0);
    assert_eq!(call("http://up.test/items").await, (StatusCode::OK, 1));
    let up = registry.get("up.test");
    assert_eq!((up.requests(), up.accepts()), (1, 1));
    assert!(up.allows_retry());
    assert_eq!(registry.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn rate_limit_reset_header_delays_the_retry() {
    let svc = Scripted::new(|n| {
        if n == 0 {
            (ms(1), 429, vec![("x-amz-retry-after", "750".to_string())])
        } else {
            (ms(1), 200, vec![])
        }
    });
    let classifier = HttpStatuses::default()
        .with(StatusCode::TOO_MANY_REQUESTS)
        .reset_headers([
            ResetHeader::retry_after(),
            ResetHeader::new("x-amz-retry-after", ResetFormat::Millis),
        ]);
    let policy = http_policy().retryable(classifier).build().unwrap();
    let started = Instant::now();
    let response = layer(policy).layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(started.elapsed(), ms(1 + 750 + 1));
}

#[tokio::test(start_paused = true)]
async fn retry_after_above_the_cap_falls_back_to_the_backoff() {
    let svc = Scripted::new(|n| {
        if n == 0 {
            (ms(1), 503, vec![("retry-after", "3600".to_string())])
        } else {
            (ms(1), 200, vec![])
        }
    });
    let policy = http_policy().build().unwrap();
    let started = Instant::now();
    layer(policy).layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(started.elapsed(), ms(1 + 10 + 1));
}

#[tokio::test(start_paused = true)]
async fn too_early_is_retried_even_for_post() {
    let svc = Scripted::new(|n| (ms(1), if n == 0 { 425 } else { 201 }, vec![]));
    let policy = http_policy().build().unwrap();
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(Attempts::of(&response), Attempts::new(2, 1));
}

#[tokio::test(start_paused = true)]
async fn idempotency_key_opts_post_in_when_enabled() {
    let with_key = || {
        Request::post("/items")
            .header("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let script = |n| (ms(1), if n == 0 { 503 } else { 201 }, vec![]);

    let svc = Scripted::new(script);
    let enabled = http_policy()
        .retry_with_idempotency_key(true)
        .build()
        .unwrap();
    let response = layer(enabled.clone())
        .layer(svc.clone())
        .oneshot(with_key())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    // Without the header, or without the opt-in, POST is not retried.
    let svc = Scripted::new(script);
    let response = layer(enabled)
        .layer(svc.clone())
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let svc = Scripted::new(script);
    let disabled = http_policy().build().unwrap();
    let response = layer(disabled)
        .layer(svc.clone())
        .oneshot(with_key())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(svc.started(), 1);
}

#[tokio::test(start_paused = true)]
async fn on_retry_hook_overrides_the_delay_and_vetoes() {
    let svc = Scripted::new(|_| (ms(1), 503, vec![]));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let policy = http_policy()
        .on_retry(move |ctx| {
            log.lock().unwrap().push((ctx.attempts, ctx.delay));
            match ctx.attempts {
                1 => RetryDecision::Delay(ms(200)),
                2 => RetryDecision::Proceed,
                _ => RetryDecision::Stop,
            }
        })
        .build()
        .unwrap();
    let started = Instant::now();
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        svc.started(),
        3,
        "vetoed before the fourth of four attempts"
    );
    assert_eq!(started.elapsed(), ms(1 + 200 + 1 + 10 + 1));
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(1, ms(10)), (2, ms(10)), (3, ms(10))]
    );
}

#[tokio::test(start_paused = true)]
async fn on_retry_hook_cannot_exceed_max_attempts() {
    let svc = Scripted::new(|_| (ms(1), 503, vec![]));
    let policy = http_policy()
        .max_attempts(2)
        .on_retry(|_| RetryDecision::Delay(Duration::ZERO))
        .build()
        .unwrap();
    layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(svc.started(), 2);
}

#[tokio::test(start_paused = true)]
async fn grpc_per_attempt_timeout_respects_the_call_deadline() {
    let svc = Scripted::new(|_| (ms(1000), 200, vec![]));
    let policy = RetryPolicy::builder()
        .max_attempts(5)
        .backoff(fixed_backoff(ms(10)))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .per_attempt_timeout(ms(100))
        .timeout(ms(250))
        .build()
        .unwrap();
    let policies = Policies::builder().method("/pkg.Svc/M", policy).build();
    let request = Request::post("/pkg.Svc/M")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let started = Instant::now();
    let error = RetryLayer::new(policies)
        .layer(svc.clone())
        .oneshot(request)
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), ms(250));
    assert!(error.to_string().contains("deadline"), "{error}");
    // 0–100, 110–210, 220–250 (cut by the deadline).
    assert_eq!(svc.started(), 3);
    assert_eq!(svc.cancelled(), 3);
}

#[tokio::test(start_paused = true)]
async fn post_is_not_hedged_on_per_attempt_timeout_without_opt_in() {
    let svc = Scripted::new(|_| (ms(300), 201, vec![]));
    let policy = http_policy()
        .per_attempt_timeout(ms(100))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .unwrap();
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        svc.started(),
        1,
        "a POST is never sent twice without opt-in"
    );
    assert_eq!(svc.cancelled(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_answer_of_the_slow_attempt_ends_a_hedge_on_timeout_call() {
    // Attempt 0 answers 404 (final for HTTP) at 150 ms; the hedge sent at 100 ms hangs.
    let svc = Scripted::new(|n| {
        if n == 0 {
            (ms(150), 404, vec![])
        } else {
            (ms(10_000), 200, vec![])
        }
    });
    let policy = http_policy()
        .max_attempts(2)
        .per_attempt_timeout(ms(100))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .unwrap();
    let started = Instant::now();
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(started.elapsed(), ms(150));
    assert_eq!(svc.started(), 2);
    assert_eq!(svc.cancelled(), 1, "the hanging hedge is cancelled");
}

fn is_deadline_exceeded(error: &BoxError) -> bool {
    last_error(error).is::<tower_retry_hedge::error::DeadlineExceeded>()
}

/// Calls a service whose every attempt would take 1 s, with a per-attempt timeout and a
/// deadline; checks that the call ends on its deadline, and gives how long it took and how
/// many attempts were started and cancelled.
async fn until_the_deadline(per_attempt: Duration, deadline: Duration) -> (Duration, u32, u32) {
    let svc = Scripted::new(|_| (ms(1000), 200, vec![]));
    let policy = http_policy()
        .per_attempt_timeout(per_attempt)
        .timeout(deadline)
        .build()
        .unwrap();
    let started = Instant::now();
    let error = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap_err();
    assert!(is_deadline_exceeded(&error), "{error}");
    (started.elapsed(), svc.started(), svc.cancelled())
}

#[tokio::test(start_paused = true)]
async fn per_attempt_timeouts_run_until_the_deadline() {
    // Attempts time out at 100 ms each, 10 ms apart; the third is cut by the deadline.
    assert_eq!(until_the_deadline(ms(100), ms(250)).await, (ms(250), 3, 3));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_before_the_per_attempt_timeout_ends_the_first_attempt() {
    assert_eq!(until_the_deadline(ms(500), ms(200)).await, (ms(200), 1, 1));
}

#[tokio::test(start_paused = true)]
async fn an_answer_at_the_deadline_loses_to_the_deadline() {
    // The first attempt answers 503 at exactly 100 ms, the call's deadline: as for any
    // attempt, the deadline wins, and the answer does not count against the throttle.
    let throttle = tower_retry_hedge::throttle::Throttle::new(10, 0.1).unwrap();
    let policies = Policies::builder()
        .route(
            Route::prefix("/"),
            http_policy().timeout(ms(100)).build().unwrap(),
        )
        .throttle(throttle.clone())
        .build();
    let svc = Scripted::new(|_| (ms(100), 503, vec![]));
    let error = RetryLayer::new(policies)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap_err();
    assert!(is_deadline_exceeded(&error), "{error}");
    assert_eq!(svc.started(), 1);
    assert_eq!(throttle.tokens(), 10.0);
}

#[tokio::test(start_paused = true)]
async fn each_attempt_is_classified_once() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let statuses = HttpStatuses::default();
    let classifier = move |result: tower_retry_hedge::classify::AttemptResult<'_>| {
        counted.fetch_add(1, Ordering::SeqCst);
        tower_retry_hedge::classify::Classify::classify(&statuses, result)
    };
    let policy = RetryPolicy::builder()
        .max_attempts(4)
        .backoff(fixed_backoff(ms(10)))
        .retryable(classifier)
        .build()
        .unwrap();
    let svc = Scripted::new(|n| (ms(5), if n == 0 { 503 } else { 200 }, vec![]));
    let response = layer(policy)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(svc.started(), 2);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one classification per attempt"
    );
}

// The one-engine behaviours that reach across layers.

#[tokio::test(start_paused = true)]
async fn a_method_with_only_a_timeout_gets_that_deadline() {
    let svc = Scripted::new(|_| (ms(1000), 200, vec![]));
    let policies = tower_retry_hedge::ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "pkg.Svc"}], "timeout": "0.25s"}]}"#,
    )
    .unwrap()
    .policies();
    let started = Instant::now();
    let request = Request::post("/pkg.Svc/Get")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let error = RetryLayer::new(policies)
        .layer(svc.clone())
        .oneshot(request)
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), ms(250), "{error}");
    assert_eq!((svc.started(), svc.cancelled()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_hedge_layer_alone_credits_the_throttle_for_calls_without_a_policy() {
    let throttle = tower_retry_hedge::throttle::Throttle::new(10, 0.5).unwrap();
    for _ in 0..4 {
        throttle.on_failure();
    }
    let before = throttle.tokens_milli();
    let policies = Policies::builder().throttle(throttle.clone()).build();
    let svc = Scripted::new(|_| (ms(1), 200, vec![]));
    let response = tower_retry_hedge::HedgeLayer::new(policies)
        .layer(svc.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(throttle.tokens_milli(), before + 500);
}

#[tokio::test(start_paused = true)]
async fn post_is_not_hedged_without_the_opt_in() {
    let hedge = |opt_in: bool| {
        tower_retry_hedge::HedgePolicy::builder()
            .max_attempts(3)
            .delay(ms(10))
            .hedge_non_idempotent(opt_in)
            .build()
            .unwrap()
    };
    for (opt_in, expected) in [(false, 1), (true, 3)] {
        let svc = Scripted::new(|_| (ms(100), 200, vec![]));
        let policies = Policies::builder()
            .route(Route::prefix("/"), hedge(opt_in))
            .build();
        tower_retry_hedge::HedgeLayer::new(policies)
            .layer(svc.clone())
            .oneshot(post())
            .await
            .unwrap();
        assert_eq!(svc.started(), expected, "opt-in {opt_in}");
    }
}

#[tokio::test(start_paused = true)]
async fn route_statistics_are_kept_under_the_route_not_each_path() {
    let svc = Scripted::new(|n| (ms(1), if n % 2 == 0 { 503 } else { 200 }, vec![]));
    // The route the calls take is not the table's first.
    let policies = Policies::builder()
        .route(Route::prefix("/other"), http_policy().build().unwrap())
        .route(Route::prefix("/api"), http_policy().build().unwrap())
        .build();
    let layer = RetryLayer::new(policies.clone());
    for i in 0..50 {
        let request = Request::get(format!("/api/items/{i}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        layer.layer(svc.clone()).oneshot(request).await.unwrap();
    }
    let snapshot = policies.stats().snapshot();
    assert_eq!(snapshot.methods.len(), 1, "{snapshot:?}");
    assert_eq!(snapshot.methods["/api"].retry_attempts, 50);
}

#[tokio::test]
async fn no_record_of_tried_backends_without_a_balancer_or_the_switch() {
    // No `balance::Balance` is made in this test binary.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorder = {
        let seen = Arc::clone(&seen);
        tower::service_fn(move |request: Req| {
            let tried = request
                .extensions()
                .get::<tower_retry_hedge::metadata::TriedBackends>()
                .is_some();
            seen.lock().unwrap().push(tried);
            async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
            }
        })
    };
    for switch in [None, Some(true)] {
        let mut policies =
            Policies::builder().route(Route::prefix("/"), http_policy().build().unwrap());
        if let Some(on) = switch {
            policies = policies.track_backends(on);
        }
        let policies = policies.build();
        assert_eq!(policies.track_backends(), switch == Some(true));
        let request = Request::get("/x").body(Full::new(Bytes::new())).unwrap();
        RetryLayer::new(policies)
            .layer(recorder.clone())
            .oneshot(request)
            .await
            .unwrap();
    }
    assert_eq!(*seen.lock().unwrap(), [false, true]);
}
