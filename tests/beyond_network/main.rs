//! Beyond A6 over the network: rate-limit headers, the retry budget, per-attempt timeouts,
//! hedging on them, `Idempotency-Key`, 425 and the `on_retry` hook, against the real HTTP and
//! gRPC peers of `tests/common` on 127.0.0.1 (`tests/beyond` covers the same features with mock
//! services on the paused clock).
//!
//! HTTP calls go through a hyper-util legacy client with `BoxBody<Bytes, BoxError>` bodies,
//! gRPC calls through the generated `EchoClient` over `RetryLayer` over a tonic `Channel`.
//! Everything runs on the real clock with small delays. Assertions are on counts, headers and
//! bytes; durations appear only as lower bounds where a server-chosen delay is the point (the
//! retry cannot arrive before the server said). `guard` only stops a broken peer from hanging
//! the run.

#[path = "../common/mod.rs"]
mod common;
mod recv_timeout;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::pb::EchoRequest;
use common::pb::echo_client::EchoClient;
use common::{
    Action, CALL_HEADER, GrpcPeer, HttpAction, HttpAttemptRecord, HttpOutcome, HttpPeer,
    HttpScript, Outcome, PEER_ATTEMPT_HEADER, Script, http_client, http2_client, spawn_grpc,
    spawn_http,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tonic::Code;
use tonic::transport::Channel;
use tower::{ServiceBuilder, ServiceExt as _};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{self, AttemptResult, GrpcCodes, HttpStatuses, ResetFormat};
use tower_retry_hedge::classify::{Outcome as Classified, ResetHeader};
use tower_retry_hedge::error::AttemptTimedOut;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::policy::{RetryDecision, RetryPolicyBuilder, Route};
use tower_retry_hedge::throttle::RetryBudget;
use tower_retry_hedge::{BoxError, Policies, Retry, RetryLayer, RetryPolicy};

type Body = BoxBody<Bytes, BoxError>;
type HttpClient = Client<HttpConnector, Body>;
type GrpcClient = EchoClient<Retry<Channel>>;

const SERVICE: &str = "test.echo.Echo";

/// Fails the test instead of hanging it if a peer or the layer misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("the call did not end within the hang guard")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn backoff() -> Exponential {
    Exponential::new(ms(1), ms(10), 2.0, Jitter::None).expect("valid backoff")
}

// ---------------------------------------------------------------------------------------------
// HTTP helpers
// ---------------------------------------------------------------------------------------------

/// 3 attempts, 1-10 ms backoff, retryable as `statuses` says.
fn http_policy(statuses: HttpStatuses) -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff())
        .retryable(statuses)
}

/// Every path under `policy`.
fn http_policies(policy: RetryPolicy) -> Policies {
    Policies::builder()
        .route(Route::prefix("/"), policy)
        .build()
}

fn retrying(policies: &Policies) -> Retry<HttpClient> {
    ServiceBuilder::new()
        .layer(RetryLayer::new(policies.clone()))
        .service(http_client())
}

fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

fn full(bytes: &'static [u8]) -> Body {
    Full::new(Bytes::from_static(bytes))
        .map_err(|never| match never {})
        .boxed()
}

fn request(peer: &HttpPeer, method: Method, call: &str, body: Body) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(peer.url("/items"))
        .header(CALL_HEADER, call)
        .body(body)
        .expect("valid request")
}

fn attempts(response: &Response<Incoming>) -> Attempts {
    Attempts::of(response)
}

fn peer_attempt(response: &Response<Incoming>) -> Option<&str> {
    response
        .headers()
        .get(PEER_ATTEMPT_HEADER)
        .and_then(|v| v.to_str().ok())
}

async fn body_bytes(response: Response<Incoming>) -> Bytes {
    guard(response.into_body().collect())
        .await
        .expect("a whole response body")
        .to_bytes()
}

/// How long after the first attempt of a two-attempt call its retry reached the peer.
fn retry_gap(records: &[HttpAttemptRecord]) -> Duration {
    assert_eq!(records.len(), 2, "{records:#?}");
    records[1].arrived.duration_since(records[0].arrived)
}

fn assert_buffers_free(policies: &Policies) {
    assert_eq!(
        policies.buffer_limits().in_use(),
        0,
        "replay buffers still held after the call"
    );
}

/// A GET answered 503 with `action`'s headers, then 200: returns the peer's records.
async fn get_503_then_ok(statuses: HttpStatuses, first: HttpAction) -> Vec<HttpAttemptRecord> {
    let peer = spawn_http(HttpScript::new().call("ra", [first])).await;
    let policies = http_policies(http_policy(statuses).build().expect("valid policy"));

    let response = guard(retrying(&policies).oneshot(request(&peer, Method::GET, "ra", empty())))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert_eq!(peer_attempt(&response), Some("1"));

    let records = peer.recorder().attempts("ra");
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].outcome, Some(HttpOutcome::Status(503)));
    assert_eq!(records[1].outcome, Some(HttpOutcome::Status(200)));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
    records
}

// ---------------------------------------------------------------------------------------------
// 1. Retry-After and rate-limit reset headers
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn retry_after_delay_seconds_delays_the_retry() {
    let records = get_503_then_ok(HttpStatuses::default(), HttpAction::retry_after(503, "1")).await;
    // The retry cannot leave before the server's second is up: the gap also holds the 503's
    // way back and the retry's way out, so only a lower bound is meaningful.
    let gap = retry_gap(&records);
    assert!(gap >= ms(900), "retried {gap:?} after the first attempt");
}

#[tokio::test]
async fn retry_after_http_date_delays_the_retry_until_the_date() {
    // HTTP-dates have whole seconds: two seconds from now, truncated, is 1-2 s away.
    let date = SystemTime::now() + Duration::from_secs(2);
    let value = httpdate::fmt_http_date(date);
    let date = httpdate::parse_http_date(&value).expect("a date we formatted");
    // Pairs the peer's monotonic arrival times with the wall clock the date is read on.
    let (mono_start, wall_start) = (tokio::time::Instant::now(), SystemTime::now());
    assert!(
        date.duration_since(wall_start).unwrap_or_default() >= ms(900),
        "the date {value} is not in the future"
    );

    let records = get_503_then_ok(
        HttpStatuses::default(),
        HttpAction::retry_after(503, value.clone()),
    )
    .await;
    let retried_at = wall_start + records[1].arrived.duration_since(mono_start);
    // The retry arrives at the date or after (100 ms of slack for the two clocks' reading).
    let early = date.duration_since(retried_at).unwrap_or_default();
    assert!(
        early <= ms(100),
        "retried {early:?} before the Retry-After date {value}"
    );
    assert!(retry_gap(&records) >= ms(500));
}

#[tokio::test]
async fn retry_after_above_max_retry_after_falls_back_to_the_backoff() {
    // An hour is above the 5 s cap: the 1 ms backoff applies instead (were the hour honoured,
    // the hang guard would fail the test).
    let statuses = HttpStatuses::default().max_retry_after(Duration::from_secs(5));
    let records = get_503_then_ok(statuses, HttpAction::retry_after(503, "3600")).await;
    assert_eq!(
        records[0].outcome,
        Some(HttpOutcome::Status(503)),
        "the first attempt was answered"
    );
}

#[tokio::test]
async fn x_amz_retry_after_in_reset_headers_delays_the_retry() {
    let statuses = HttpStatuses::default().reset_headers([
        ResetHeader::retry_after(),
        ResetHeader::new("x-amz-retry-after", ResetFormat::Millis),
    ]);
    let first = HttpAction::status(503).header("x-amz-retry-after", "400");
    let records = get_503_then_ok(statuses, first).await;
    let gap = retry_gap(&records);
    assert!(gap >= ms(400), "retried {gap:?} after the first attempt");
}

#[tokio::test]
async fn retry_after_jitter_never_comes_back_early() {
    // Jitter spreads U(d, 1.5 d): only ever later than the server's delay.
    let statuses = HttpStatuses::default().retry_after_jitter(true);
    let records = get_503_then_ok(statuses, HttpAction::retry_after(503, "1")).await;
    let gap = retry_gap(&records);
    assert!(gap >= ms(900), "retried {gap:?} after the first attempt");
}

// ---------------------------------------------------------------------------------------------
// 2. The retry budget
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn retry_budget_caps_retries_at_a_fifth_of_calls_in_a_failure_burst() {
    const CALLS: usize = 50;
    let peer = spawn_http(HttpScript::always(HttpAction::status(503))).await;
    // 20 % of the calls of the last 10 s, no floor.
    let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.2).expect("valid budget");
    let policy = http_policy(HttpStatuses::default())
        .build()
        .expect("valid policy");
    let policies = Policies::builder()
        .route(Route::prefix("/"), policy)
        .throttle(budget.clone())
        .build();
    let svc = retrying(&policies);

    let mut sent = Vec::with_capacity(CALLS);
    for call in 0..CALLS {
        let call = call.to_string();
        let response = guard(
            svc.clone()
                .oneshot(request(&peer, Method::GET, &call, empty())),
        )
        .await
        .expect("a response");
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "call {call}"
        );
        sent.push(attempts(&response).sent());
    }

    let recorder = peer.recorder();
    assert_eq!(recorder.total_attempts(), CALLS + CALLS / 5, "{sent:?}");
    assert_eq!(
        sent.iter().map(|&n| n as usize).sum::<usize>(),
        CALLS + CALLS / 5
    );
    // Each fifth call finds one retry in the budget (floor(0.2 × calls) − retries so far), and
    // its second failure finds none left.
    for (call, &n) in sent.iter().enumerate() {
        let expected = if (call + 1) % 5 == 0 { 2 } else { 1 };
        assert_eq!(n, expected, "call {call}: {sent:?}");
        assert_eq!(recorder.attempt_count(call.to_string()), expected as usize);
    }
    assert_eq!(budget.remaining(), 0);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

// ---------------------------------------------------------------------------------------------
// 3, 4. Per-attempt timeouts and hedging on them, over tonic
// ---------------------------------------------------------------------------------------------

async fn grpc_client(peer: &GrpcPeer, policies: &Policies) -> GrpcClient {
    EchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies.clone()))
            .service(peer.channel().await),
    )
}

fn grpc_policies(policy: RetryPolicy) -> Policies {
    Policies::builder().service(SERVICE, policy).build()
}

fn grpc_policy() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .backoff(backoff())
        .retryable(GrpcCodes::from([classify::Code::Unavailable]))
}

fn echo(call: u32, message: &str) -> EchoRequest {
    EchoRequest {
        message: message.to_owned(),
        payload: message.as_bytes().to_vec(),
        call,
    }
}

#[tokio::test]
async fn grpc_per_attempt_timeout_cancels_the_hung_attempt_and_retries() {
    let peer = spawn_grpc(Script::new().call(0, [Action::Hang, Action::Ok])).await;
    // Generous for a loopback unary call, short enough to keep the test quick.
    let policy = grpc_policy()
        .max_attempts(2)
        .per_attempt_timeout(ms(300))
        .build()
        .expect("valid policy");
    let policies = grpc_policies(policy);
    let mut client = grpc_client(&peer, &policies).await;

    let response = guard(client.unary(echo(0, "slow then fast")))
        .await
        .expect("the second attempt succeeds");
    assert_eq!(
        response.extensions().get::<Attempts>(),
        Some(&Attempts::new(2, 0))
    );
    assert_eq!(
        response
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let reply = response.into_inner();
    assert_eq!(reply.attempt, 1, "the server answered its second attempt");
    assert_eq!(reply.message, "slow then fast");

    // Dropping the timed-out attempt reset its stream: the server saw it go.
    let recorder = peer.recorder();
    guard(recorder.wait_for_cancelled(0, 1)).await;
    let records = recorder.attempts(0);
    assert_eq!(records.len(), 2);
    assert!(records[0].cancelled);
    assert_eq!(records[0].outcome, None);
    assert_eq!(records[0].previous_attempts, None);
    assert!(!records[1].cancelled);
    assert_eq!(records[1].outcome, Some(Outcome::Ok));
    assert_eq!(records[1].previous_attempts.as_deref(), Some("1"));
    assert!(
        records
            .iter()
            .all(|r| r.payload.as_ref() == b"slow then fast")
    );
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn grpc_per_attempt_timeouts_on_every_attempt_end_the_call() {
    let peer = spawn_grpc(Script::always(Action::Hang)).await;
    let policy = grpc_policy()
        .max_attempts(3)
        .per_attempt_timeout(ms(50))
        .build()
        .expect("valid policy");
    let policies = grpc_policies(policy);
    let mut client = grpc_client(&peer, &policies).await;

    let status = guard(client.unary(echo(0, "never")))
        .await
        .expect_err("every attempt hangs");
    // No server status came back: CANCELLED from the layer (as gRPC C-core ends a call whose
    // last attempt outlived its perAttemptRecvTimeout), its own error as source.
    assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
    // The layer's error is in the status's chain: the call's `Attempted`, then the last
    // attempt's status, whose source is the layer's own `AttemptTimedOut`.
    assert!(
        std::iter::successors(std::error::Error::source(&status), |e| e.source())
            .any(|source| source.is::<AttemptTimedOut>()),
        "{status:?}"
    );
    // Every attempt reached the server and was cancelled there.
    let recorder = peer.recorder();
    guard(recorder.wait_for_cancelled(0, 3)).await;
    let records = recorder.attempts(0);
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|r| r.cancelled && r.outcome.is_none()));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn grpc_hedge_on_per_attempt_timeout_keeps_the_slow_first_attempt() {
    // Attempt 0 answers after 300 ms; the hedges started every 50 ms hang.
    let peer = spawn_grpc(
        Script::new()
            .call(0, [Action::delay(ms(300), Action::Ok)])
            .otherwise(Action::Hang),
    )
    .await;
    let policy = grpc_policy()
        .max_attempts(3)
        .per_attempt_timeout(ms(50))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .expect("valid policy");
    let policies = grpc_policies(policy);
    let mut client = grpc_client(&peer, &policies).await;

    let response = guard(client.unary(echo(0, "first wins")))
        .await
        .expect("the slow first attempt succeeds");
    let sent = response
        .extensions()
        .get::<Attempts>()
        .copied()
        .unwrap_or_default()
        .sent();
    assert!((2..=3).contains(&sent), "{sent} attempts sent");
    let reply = response.into_inner();
    assert_eq!(reply.attempt, 0, "the first attempt, left running, won");
    assert_eq!(reply.message, "first wins");

    // The hedges still running when attempt 0 won were dropped: the server sees each one
    // cancelled (one that never reached its handler is not recorded at all).
    let recorder = peer.recorder();
    guard(recorder.wait_until(|all| {
        let call: Vec<_> = all.iter().filter(|r| r.call == 0).collect();
        call.len() >= 2 && call.iter().all(|r| r.attempt == 0 || r.cancelled)
    }))
    .await;
    let records = recorder.attempts(0);
    assert!(records.len() >= 2, "{records:#?}");
    assert!(records.len() <= sent as usize, "{records:#?}");
    assert!(!records[0].cancelled);
    assert_eq!(records[0].outcome, Some(Outcome::Ok));
    for (i, record) in records.iter().enumerate().skip(1) {
        assert!(record.cancelled, "hedge {i} still running");
        assert_eq!(record.outcome, None);
        // Hedges are later attempts of the same call and say so.
        assert_eq!(record.previous_attempts, Some(i.to_string()));
        assert_eq!(record.payload.as_ref(), b"first wins");
    }
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn grpc_hedge_on_per_attempt_timeout_returns_a_fatal_answer_of_the_slow_attempt() {
    // Attempt 0 fails with a fatal code after 200 ms; the one hedge allowed hangs. The fatal
    // answer ends the call (as a fatal status ends a hedged call in A6), rather than being
    // dropped while the call waits on the hedge.
    let peer = spawn_grpc(
        Script::new()
            .call(
                0,
                [Action::delay(ms(200), Action::fail(Code::InvalidArgument))],
            )
            .otherwise(Action::Hang),
    )
    .await;
    let policy = grpc_policy()
        .max_attempts(2)
        .per_attempt_timeout(ms(50))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .expect("valid policy");
    let policies = grpc_policies(policy);
    let mut client = grpc_client(&peer, &policies).await;

    let status = guard(client.unary(echo(0, "bad request")))
        .await
        .expect_err("the first attempt's answer is fatal");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    let recorder = peer.recorder();
    guard(recorder.wait_for_cancelled(0, 1)).await;
    let records = recorder.attempts(0);
    assert_eq!(records.len(), 2, "{records:#?}");
    assert_eq!(
        records[0].outcome,
        Some(Outcome::Status {
            code: Code::InvalidArgument,
            pushback: None
        })
    );
    assert!(records[1].cancelled, "the hedge was left running");
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn grpc_hedge_on_per_attempt_timeout_returns_a_fatal_answer_of_the_hedge() {
    // Attempt 0 would answer OK after 300 ms; the hedge sent at 50 ms fails at once with a
    // fatal code. The first non-retryable answer ends the call, whichever attempt gave it,
    // and the slow attempt is cancelled.
    let peer = spawn_grpc(Script::new().call(
        0,
        [
            Action::delay(ms(300), Action::Ok),
            Action::fail(Code::InvalidArgument),
        ],
    ))
    .await;
    let policy = grpc_policy()
        .max_attempts(2)
        .per_attempt_timeout(ms(50))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .expect("valid policy");
    let policies = grpc_policies(policy);
    let mut client = grpc_client(&peer, &policies).await;

    let status = guard(client.unary(echo(0, "bad request")))
        .await
        .expect_err("the hedge's answer is fatal");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    let recorder = peer.recorder();
    guard(recorder.wait_for_cancelled(0, 1)).await;
    let records = recorder.attempts(0);
    assert_eq!(records.len(), 2, "{records:#?}");
    assert!(records[0].cancelled, "the slow attempt was left running");
    assert_eq!(records[0].outcome, None);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

// ---------------------------------------------------------------------------------------------
// 5. Idempotency-Key and 425 Too Early
// ---------------------------------------------------------------------------------------------

const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

fn post_with_key(peer: &HttpPeer, call: &str, key: Option<&str>) -> Request<Body> {
    let mut request = request(peer, Method::POST, call, full(b"order #7"));
    if let Some(key) = key {
        request.headers_mut().insert(
            "idempotency-key",
            key.parse().expect("a valid header value"),
        );
    }
    request
}

#[tokio::test]
async fn post_with_idempotency_key_is_retried_when_the_policy_opts_in() {
    let peer = spawn_http(HttpScript::new().call("key", [HttpAction::status(503)])).await;
    let policy = http_policy(HttpStatuses::default())
        .retry_with_idempotency_key(true)
        .build()
        .expect("valid policy");
    let policies = http_policies(policy);

    let response = guard(retrying(&policies).oneshot(post_with_key(&peer, "key", Some(KEY))))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert_eq!(body_bytes(response).await, "order #7");

    let records = peer.recorder().attempts("key");
    assert_eq!(records.len(), 2);
    for record in &records {
        assert_eq!(record.method, Method::POST);
        // The same key and the same bytes on both attempts: the server can deduplicate.
        assert_eq!(record.header("idempotency-key"), Some(KEY));
        assert!(record.body_complete);
        assert_eq!(record.body, "order #7");
    }
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn post_is_not_retried_without_the_key_or_without_the_opt_in() {
    let script = HttpScript::new()
        .call("no-key", [HttpAction::status(503)])
        .call("no-opt-in", [HttpAction::status(503)]);
    let peer = spawn_http(script).await;
    let opted_in = http_policies(
        http_policy(HttpStatuses::default())
            .retry_with_idempotency_key(true)
            .build()
            .expect("valid policy"),
    );
    let opted_out = http_policies(
        http_policy(HttpStatuses::default())
            .build()
            .expect("valid policy"),
    );

    for (call, policies, key) in [
        ("no-key", &opted_in, None),
        ("no-opt-in", &opted_out, Some(KEY)),
    ] {
        let response = guard(retrying(policies).oneshot(post_with_key(&peer, call, key)))
            .await
            .expect("a response");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{call}");
        assert_eq!(attempts(&response), Attempts::new(1, 0), "{call}");
        assert_eq!(peer.recorder().attempt_count(call), 1, "{call}");
        assert_buffers_free(policies);
    }
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn too_early_post_is_retried_once_without_opt_in() {
    let peer = spawn_http(HttpScript::new().call("early", [HttpAction::status(425)])).await;
    let policies = http_policies(
        http_policy(HttpStatuses::default())
            .build()
            .expect("valid policy"),
    );

    let response = guard(retrying(&policies).oneshot(post_with_key(&peer, "early", None)))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    // The 425 retry is transparent: the server did not process the request.
    assert_eq!(attempts(&response), Attempts::new(2, 1));
    assert_eq!(body_bytes(response).await, "order #7");
    let records = peer.recorder().attempts("early");
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].outcome, Some(HttpOutcome::Status(425)));
    assert!(records.iter().all(|r| r.body == "order #7"));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn too_early_retry_does_not_open_post_to_status_retries() {
    // 425, then 503: the 503 on a POST without opt-in is returned, not retried.
    let peer = spawn_http(
        HttpScript::new().call("early", [HttpAction::status(425), HttpAction::status(503)]),
    )
    .await;
    let policies = http_policies(
        http_policy(HttpStatuses::default())
            .build()
            .expect("valid policy"),
    );

    let response = guard(retrying(&policies).oneshot(post_with_key(&peer, "early", None)))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(attempts(&response), Attempts::new(2, 1));
    assert_eq!(peer.recorder().attempt_count("early"), 2);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn post_is_not_hedged_on_per_attempt_timeout_without_opt_in() {
    // A slow POST must not be sent twice: without an opt-in its per-attempt timeout sends no
    // hedge, and the first attempt goes on and answers.
    let peer =
        spawn_http(HttpScript::new().call("slow", [HttpAction::delay(ms(300), HttpAction::Ok)]))
            .await;
    let policy = http_policy(HttpStatuses::default())
        .per_attempt_timeout(ms(50))
        .hedge_on_per_attempt_timeout(true)
        .build()
        .expect("valid policy");
    let policies = http_policies(policy);

    let response = guard(retrying(&policies).oneshot(post_with_key(&peer, "slow", None)))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response), Attempts::new(1, 0));
    assert_eq!(body_bytes(response).await, "order #7");
    assert_eq!(peer.recorder().attempt_count("slow"), 1);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn post_with_idempotency_key_is_hedged_on_per_attempt_timeout() {
    // With the key and the opt-in, the POST is hedged after 50 ms; the hedge answers at once
    // and wins, and the slow first attempt is cancelled (HTTP/2: its stream is reset).
    let peer = spawn_http(HttpScript::new().call(
        "keyed",
        [HttpAction::delay(Duration::from_secs(5), HttpAction::Ok)],
    ))
    .await;
    let policy = http_policy(HttpStatuses::default())
        .per_attempt_timeout(ms(50))
        .hedge_on_per_attempt_timeout(true)
        .retry_with_idempotency_key(true)
        .build()
        .expect("valid policy");
    let policies = http_policies(policy);
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies.clone()))
        .service(http2_client::<Body>());

    let response = guard(svc.oneshot(post_with_key(&peer, "keyed", Some(KEY))))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert_eq!(peer_attempt(&response), Some("1"), "the hedge won");
    assert_eq!(body_bytes(response).await, "order #7");

    let recorder = peer.recorder();
    guard(recorder.wait_for_cancelled("keyed", 1)).await;
    let records = recorder.attempts("keyed");
    assert_eq!(records.len(), 2);
    assert!(records[0].cancelled);
    assert!(
        records
            .iter()
            .all(|r| r.body == "order #7" && r.header("idempotency-key") == Some(KEY))
    );
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

// ---------------------------------------------------------------------------------------------
// The on_retry hook sees the real response
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn on_retry_hook_sees_the_response_and_its_pushback_and_can_veto() {
    let peer = spawn_http(HttpScript::new().call(
        "hook",
        [HttpAction::retry_after(503, "7").header("x-reason", "maintenance")],
    ))
    .await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let policy = http_policy(HttpStatuses::default())
        .on_retry(move |ctx| {
            let reason = match ctx.result {
                AttemptResult::Response { status, headers } => Some((
                    status,
                    headers
                        .get("x-reason")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned),
                )),
                _ => None,
            };
            log.lock().unwrap_or_else(PoisonError::into_inner).push((
                ctx.attempts,
                ctx.outcome,
                ctx.delay,
                reason,
            ));
            // A server in maintenance will not be back in time: give up at once.
            RetryDecision::Stop
        })
        .build()
        .expect("valid policy");
    let policies = http_policies(policy);

    let response = guard(retrying(&policies).oneshot(request(&peer, Method::GET, "hook", empty())))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(attempts(&response), Attempts::new(1, 0));
    assert_eq!(peer.recorder().attempt_count("hook"), 1);

    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (counted, outcome, delay, reason) = &seen[0];
    assert_eq!(*counted, 1);
    assert!(
        matches!(outcome, Classified::Retryable(Some(_))),
        "{outcome:?}"
    );
    assert_eq!(*delay, Duration::from_secs(7), "the server's Retry-After");
    assert_eq!(
        reason,
        &Some((
            StatusCode::SERVICE_UNAVAILABLE,
            Some("maintenance".to_owned())
        ))
    );
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}
