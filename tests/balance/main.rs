//! `balance::Balance` over mock endpoints: which endpoint each request reaches, with and
//! without the call's record of tried backends, while endpoints come, go, and fail; then under
//! the retry and hedge layers on the paused clock; its outlier detection in `outliers.rs`.
//! (`tests/balance_network` runs it over real tonic servers.)

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http_body_util::Full;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::buffer::Buffer;
use tower::discover::Change;
use tower::load::{CompleteOnResponse, Constant, Load, PendingRequests};
use tower::util::BoxService;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::balance::{Balance, NoReadyEndpoint, OutlierDetection, ResponseBody};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::metadata::{BackendId, TriedBackends};
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy};
use tower_test::mock::{self, Handle, SendResponse, Spawn};

mod outliers;

type Req = http::Request<Full<Bytes>>;
type Res = http::Response<http_body_util::Empty<bytes::Bytes>>;
/// A mock endpoint with a fixed load.
type Endpoint = Constant<mock::Mock<Req, Res>, u32>;
type Discovered = Result<Change<&'static str, Endpoint>, BoxError>;
type Discovery = UnboundedReceiverStream<Discovered>;

/// The balancer's response, with its body as the endpoint gave it.
fn plain<E>(
    result: Result<http::Response<ResponseBody<http_body_util::Empty<bytes::Bytes>>>, E>,
) -> Result<Res, E> {
    result.map(|response| response.map(ResponseBody::into_inner))
}

const SERVICE: &str = "test.echo.Echo";
const PATH: &str = "/test.echo.Echo/Unary";

fn request(tried: Option<&TriedBackends>) -> Req {
    let mut request = http::Request::post(PATH)
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .expect("valid request");
    if let Some(tried) = tried {
        request.extensions_mut().insert(tried.clone());
    }
    request
}

fn id(name: &'static str) -> BackendId {
    BackendId::of(&name)
}

/// A record that holds these endpoints, as if earlier attempts of the call had used them.
fn tried(names: &[&'static str]) -> TriedBackends {
    let tried = TriedBackends::default();
    for name in names {
        tried.record_id(id(name));
    }
    tried
}

/// A balancer over mock endpoints, driven on a mock task, with the discovery stream and the
/// endpoints' handles in the test's hands. The tests that use it run outside a runtime: in a
/// tokio task, the channels behind the mocks would hold back a message once the task has
/// polled them many times without yielding (tokio's cooperative budget).
struct Backends {
    balance: Spawn<Balance<Discovery, Req>>,
    changes: mpsc::UnboundedSender<Discovered>,
    /// Every endpoint's handle, the removed ones too (their calls in flight go on).
    handles: Vec<(&'static str, Handle<Req, Res>)>,
}

/// A call the balancer dispatched: where it went, its reply handle, its response future.
struct Sent {
    endpoint: &'static str,
    reply: SendResponse<Res>,
    response: Pin<Box<dyn Future<Output = Result<Res, BoxError>>>>,
}

impl Backends {
    fn new(endpoints: &[(&'static str, u32)]) -> Self {
        let (changes, receiver) = mpsc::unbounded_channel();
        let mut backends = Backends {
            balance: Spawn::new(Balance::with_seed(
                UnboundedReceiverStream::new(receiver),
                1,
            )),
            changes,
            handles: Vec::new(),
        };
        for &(name, load) in endpoints {
            backends.insert(name, load);
        }
        backends
    }

    fn insert(&mut self, name: &'static str, load: u32) -> &mut Handle<Req, Res> {
        let (service, handle) = mock::pair::<Req, Res>();
        self.send_change(Ok(Change::Insert(name, Constant::new(service, load))));
        self.handles.push((name, handle));
        &mut self.handles.last_mut().expect("just pushed").1
    }

    fn remove(&mut self, name: &'static str) {
        self.send_change(Ok(Change::Remove(name)));
    }

    fn send_change(&self, change: Discovered) {
        self.changes
            .send(change)
            .expect("the balancer holds the stream");
    }

    fn assert_ready(&mut self) {
        match self.balance.poll_ready() {
            Poll::Ready(Ok(())) => {}
            other => panic!("balancer not ready: {other:?}"),
        }
    }

    /// Sends a request through the balancer and finds the endpoint that received it.
    fn send(&mut self, tried: Option<&TriedBackends>) -> Sent {
        self.assert_ready();
        let response = Box::pin(self.balance.call(request(tried)).map(plain));
        let mut received =
            self.handles
                .iter_mut()
                .filter_map(|(name, handle)| match handle.poll_request() {
                    Poll::Ready(Some((_, reply))) => Some((*name, reply)),
                    _ => None,
                });
        let (endpoint, reply) = received.next().expect("an endpoint received the request");
        assert!(
            received.next().is_none(),
            "two endpoints received one request"
        );
        Sent {
            endpoint,
            reply,
            response,
        }
    }

    /// Sends `calls` requests, each with a copy of `tried`'s ids, answers each at once, and
    /// counts where they went.
    fn spread(&mut self, calls: usize, tried: &[&'static str]) -> HashMap<&'static str, usize> {
        let mut counts = HashMap::new();
        for _ in 0..calls {
            let record = self::tried(tried);
            let sent = self.send(Some(&record));
            *counts.entry(sent.endpoint).or_default() += 1;
            sent.reply
                .send_response(http::Response::new(http_body_util::Empty::new()));
        }
        counts
    }
}

#[test]
fn the_attempts_of_a_call_go_to_endpoints_it_has_not_tried() {
    let mut backends = Backends::new(&[("a", 0), ("b", 0), ("c", 0)]);
    for _ in 0..100 {
        let record = TriedBackends::default();
        let mut used = Vec::new();
        let mut in_flight = Vec::new();
        for _ in 0..3 {
            let sent = backends.send(Some(&record));
            used.push(sent.endpoint);
            in_flight.push(sent.reply);
        }
        let mut distinct = used.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct, ["a", "b", "c"], "attempts went to {used:?}");
        // The balancer recorded each pick, in order.
        let expected: Vec<BackendId> = used.iter().map(|name| id(name)).collect();
        assert_eq!(record.ids(), expected);
        // A fourth attempt: every endpoint was tried, so any of them may take it.
        let fourth = backends.send(Some(&record));
        assert_eq!(record.ids().len(), 4);
        assert_eq!(record.ids()[3], id(fourth.endpoint));
        // The names of the record are left to balancers that record names.
        assert!(record.list().is_empty());
        for reply in in_flight {
            reply.send_response(http::Response::new(http_body_util::Empty::new()));
        }
        fourth
            .reply
            .send_response(http::Response::new(http_body_util::Empty::new()));
    }
}

#[test]
fn a_tried_endpoint_is_passed_over_even_when_it_is_the_least_loaded() {
    let mut backends = Backends::new(&[("a", 0), ("b", 5), ("c", 9)]);
    // Among b and c, power of two choices always draws both: b, the lighter, wins.
    let counts = backends.spread(300, &["a"]);
    assert_eq!(counts, HashMap::from([("b", 300)]));
    let counts = backends.spread(300, &["b"]);
    assert_eq!(counts, HashMap::from([("a", 300)]));
    let counts = backends.spread(300, &["b", "a"]);
    assert_eq!(counts, HashMap::from([("c", 300)]));
}

#[test]
fn when_every_endpoint_was_tried_the_pick_is_a_normal_one() {
    let mut backends = Backends::new(&[("a", 0), ("b", 1), ("c", 2)]);
    let all_tried = backends.spread(600, &["a", "b", "c"]);
    let no_record = {
        let mut counts = HashMap::new();
        for _ in 0..600 {
            let sent = backends.send(None);
            *counts.entry(sent.endpoint).or_insert(0) += 1;
            sent.reply
                .send_response(http::Response::new(http_body_util::Empty::new()));
        }
        counts
    };
    for counts in [all_tried, no_record] {
        // Power of two choices: the heaviest never wins a draw, the lightest wins the two
        // draws of three it is in, the middle one the last.
        assert_eq!(counts.get("c"), None, "{counts:?}");
        let (a, b) = (counts["a"], counts["b"]);
        assert!((340..460).contains(&a) && a + b == 600, "{counts:?}");
    }
}

#[test]
fn a_request_without_a_record_gets_none() {
    let mut backends = Backends::new(&[("a", 0), ("b", 0)]);
    backends.assert_ready();
    let response = backends.balance.call(request(None));
    let mut reply = None;
    for (_, handle) in &mut backends.handles {
        if let Poll::Ready(Some((request, send))) = handle.poll_request() {
            assert!(request.extensions().get::<TriedBackends>().is_none());
            reply = Some(send);
        }
    }
    reply
        .expect("an endpoint received the request")
        .send_response(http::Response::new(http_body_util::Empty::new()));
    let response = response.now_or_never().expect("answered");
    response.expect("the endpoint's response");
}

#[test]
fn a_tried_endpoint_takes_the_attempt_when_no_untried_one_is_ready() {
    let mut backends = Backends::new(&[("a", 0), ("b", 0)]);
    // c is known but not ready.
    backends.insert("c", 0).allow(0);
    let counts = backends.spread(200, &["a", "b"]);
    assert_eq!(counts.len(), 2, "a and b both take attempts: {counts:?}");
    assert_eq!(counts.get("c"), None);
    // Once c is ready, the attempts that tried a and b go to c.
    let (_, handle) = backends
        .handles
        .iter_mut()
        .find(|(name, _)| *name == "c")
        .expect("c's handle");
    handle.allow(u64::MAX);
    assert!(
        backends.balance.is_woken(),
        "c's readiness wakes the balancer"
    );
    let counts = backends.spread(200, &["a", "b"]);
    assert_eq!(counts, HashMap::from([("c", 200)]));
}

/// Issue 30: an endpoint behind a tokio `Buffer` (as every tonic channel is), polled again
/// after it took a request, says Pending once the task has spent its tokio budget, only to
/// make the task yield; and tokio wakes it when a worker thread next runs out of work.
/// The balancer polls its endpoints outside the budget, so the attempt that tried the two
/// others still goes to it.
#[tokio::test]
async fn an_endpoint_polled_once_the_task_spent_its_tokio_budget_is_still_picked() {
    use tokio::task::coop::{consume_budget, has_budget_remaining};

    let buffered = |name: &'static str| {
        let service = tower::service_fn(|_: Req| async {
            Ok::<_, Infallible>(Res::new(http_body_util::Empty::new()))
        });
        Ok::<_, Infallible>(Change::Insert(
            name,
            Constant::new(Buffer::new(service, 16), 0),
        ))
    };
    let changes = futures_util::stream::iter(["a", "b", "c"].map(buffered));
    let mut balance = Balance::with_seed(changes, 1);
    // In a task of the runtime, where tokio counts the budget.
    let picked = tokio::spawn(async move {
        std::future::poll_fn(|cx| balance.poll_ready(cx))
            .await
            .expect("ready");
        // An attempt that tried b and c takes a, which goes back to be polled ready.
        let first = tried(&["b", "c"]);
        drop(balance.call(request(Some(&first))));
        assert_eq!(first.ids().last(), Some(&id("a")));
        // The task spends its budget, without yielding.
        for _ in 0..1_000 {
            if !has_budget_remaining() {
                break;
            }
            consume_budget().await;
        }
        assert!(!has_budget_remaining(), "the budget is spent");
        let ready = std::future::poll_fn(|cx| Poll::Ready(balance.poll_ready(cx))).await;
        assert!(matches!(ready, Poll::Ready(Ok(()))), "{ready:?}");
        let next = tried(&["b", "c"]);
        drop(balance.call(request(Some(&next))));
        next.ids().last().copied()
    });
    assert_eq!(picked.await.expect("the task ran"), Some(id("a")));
}

#[test]
fn endpoints_added_and_removed_while_calls_are_in_flight() {
    let mut backends = Backends::new(&[("a", 0), ("b", 0)]);
    // Calls in flight on both endpoints.
    let mut in_flight: Vec<Sent> = (0..20).map(|_| backends.send(None)).collect();
    assert!(in_flight.iter().any(|sent| sent.endpoint == "a"));
    assert!(in_flight.iter().any(|sent| sent.endpoint == "b"));

    // c comes, a goes, while those calls wait.
    backends.insert("c", 0);
    backends.remove("a");
    let counts = backends.spread(200, &[]);
    assert_eq!(counts.get("a"), None, "a was removed: {counts:?}");
    assert!(counts["b"] > 0 && counts["c"] > 0, "{counts:?}");
    // A call that tried b goes to c, the only other endpoint left.
    assert_eq!(backends.spread(100, &["b"]), HashMap::from([("c", 100)]));
    assert_eq!(backends.balance.get_ref().len(), 2);

    // The calls in flight on the removed endpoint still get their answers.
    for sent in in_flight.drain(..) {
        sent.reply
            .send_response(http::Response::new(http_body_util::Empty::new()));
        let response = sent.response.now_or_never().expect("answered");
        assert!(response.is_ok(), "{}: {response:?}", sent.endpoint);
    }

    // a comes back under the same key: a call that tried it before still avoids it.
    backends.insert("a", 0);
    backends.remove("c");
    assert_eq!(backends.spread(100, &["a"]), HashMap::from([("b", 100)]));
    assert_eq!(backends.spread(100, &["b"]), HashMap::from([("a", 100)]));
}

#[test]
fn with_no_endpoint_the_balancer_waits_for_discovery() {
    let mut backends = Backends::new(&[]);
    assert!(backends.balance.poll_ready().is_pending());
    assert!(backends.balance.get_ref().is_empty());
    backends.insert("a", 0);
    assert!(
        backends.balance.is_woken(),
        "an insertion wakes the balancer"
    );
    let sent = backends.send(None);
    assert_eq!(sent.endpoint, "a");
    sent.reply
        .send_response(http::Response::new(http_body_util::Empty::new()));

    // Every endpoint gone: not ready again.
    backends.remove("a");
    assert!(backends.balance.poll_ready().is_pending());
}

#[test]
fn a_call_without_a_ready_endpoint_fails_instead_of_panicking() {
    let mut backends = Backends::new(&[]);
    let response = backends.balance.call(request(None)).now_or_never();
    let error = response.expect("fails at once").expect_err("no endpoint");
    assert!(error.is::<NoReadyEndpoint>(), "{error}");
}

#[test]
fn a_discovery_error_comes_out_of_poll_ready() {
    let mut backends = Backends::new(&[("a", 0)]);
    backends.send_change(Err("resolver failed".into()));
    match backends.balance.poll_ready() {
        Poll::Ready(Err(error)) => assert_eq!(error.to_string(), "resolver failed"),
        other => panic!("expected the discovery error, got {other:?}"),
    }
}

#[test]
fn an_endpoint_that_fails_to_get_ready_is_dropped() {
    let mut backends = Backends::new(&[("a", 0)]);
    backends.insert("b", 0).send_error("connection refused");
    let counts = backends.spread(50, &[]);
    assert_eq!(counts, HashMap::from([("a", 50)]));
    assert_eq!(backends.balance.get_ref().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Under the layers, on the paused clock.
// ---------------------------------------------------------------------------------------------

/// What the endpoints of a layered test received: `(endpoint, attempt number)` in order.
type Arrivals = Arc<Mutex<Vec<(&'static str, u32)>>>;

/// A backend that answers with `status` after `delay`, and notes each request it gets.
fn backend(
    name: &'static str,
    status: &'static str,
    delay: Duration,
    arrivals: &Arrivals,
) -> BoxService<Req, Res, Infallible> {
    let arrivals = Arc::clone(arrivals);
    let service = tower::service_fn(move |request: Req| {
        let attempt = request
            .headers()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
            .map_or(1, |previous| previous + 1);
        arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name, attempt));
        async move {
            tokio::time::sleep(delay).await;
            let response = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", status)
                .body(http_body_util::Empty::new())
                .expect("valid response");
            Ok::<_, Infallible>(response)
        }
    });
    BoxService::new(service)
}

/// A backend whose load is its requests in flight.
fn counted(
    service: BoxService<Req, Res, Infallible>,
) -> PendingRequests<BoxService<Req, Res, Infallible>> {
    PendingRequests::new(service, CompleteOnResponse::default())
}

/// A backend whose load is always 0, as tonic's endpoints report: the pick is uniform.
fn unmeasured(
    service: BoxService<Req, Res, Infallible>,
) -> Constant<BoxService<Req, Res, Infallible>, u32> {
    Constant::new(service, 0)
}

/// A buffered balancer over these backends, keyed by name, with this outlier detection.
fn balanced<S>(
    backends: Vec<(&'static str, S)>,
    outlier_detection: OutlierDetection,
) -> impl Service<Req, Response = Res, Error = BoxError, Future: Send> + Clone + Send + 'static
where
    S: Service<Req, Response = Res, Error = Infallible, Future: Send>
        + Load<Metric: PartialOrd>
        + Send
        + 'static,
{
    let changes: Vec<Result<_, Infallible>> = backends
        .into_iter()
        .map(|(name, service)| Ok(Change::Insert(name, service)))
        .collect();
    // The stream ends once every backend is in: the balancer keeps them.
    let balance = Balance::with_seed(futures_util::stream::iter(changes), 7)
        .outlier_detection(outlier_detection);
    // The mock answers are Trailers-Only: judged on their headers, their bodies are plain.
    Buffer::new(balance, 64).map_response(
        |response: http::Response<ResponseBody<http_body_util::Empty<bytes::Bytes>>>| {
            response.map(ResponseBody::into_inner)
        },
    )
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The arrivals, call by call: calls run one after another, so each first attempt starts one.
fn calls(arrivals: &Arrivals) -> Vec<Vec<&'static str>> {
    let mut calls: Vec<Vec<&'static str>> = Vec::new();
    for &(endpoint, attempt) in arrivals
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        match calls.last_mut() {
            Some(call) if attempt > 1 => call.push(endpoint),
            _ => calls.push(vec![endpoint]),
        }
    }
    calls
}

fn repeats(call: &[&'static str]) -> bool {
    call.iter()
        .enumerate()
        .any(|(i, endpoint)| call[..i].contains(endpoint))
}

/// 300 calls one after another through the retry layer (3 attempts, 1 ms backoff) over a
/// balancer of three backends, one of which always answers UNAVAILABLE; how many failed, and
/// what each call's attempts reached. `record: None` leaves the table's switch at its default.
/// Outlier detection is off: these tests are about the record alone.
async fn retry_over_one_dead_backend(record: Option<bool>) -> (usize, Vec<Vec<&'static str>>) {
    let arrivals = Arrivals::default();
    let balanced = balanced(
        vec![
            ("dead", counted(backend("dead", "14", ms(1), &arrivals))),
            ("a", counted(backend("a", "0", ms(1), &arrivals))),
            ("b", counted(backend("b", "0", ms(1), &arrivals))),
        ],
        OutlierDetection::disabled(),
    );
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Exponential::new(ms(1), ms(1), 2.0, Jitter::None).expect("valid backoff"))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("valid policy");
    let mut policies = Policies::builder().service(SERVICE, policy);
    if let Some(record) = record {
        policies = policies.track_backends(record);
    }
    let policies = policies.build();
    // The record is the table's explicit choice: off unless asked for.
    assert_eq!(policies.track_backends(), record.unwrap_or(false));
    let service = RetryLayer::new(policies).layer(balanced);
    let mut failed = 0;
    for _ in 0..300 {
        let response = service.clone().oneshot(request(None)).await;
        let response = response.expect("the backends answer");
        if response.headers()["grpc-status"] != "0" {
            failed += 1;
        }
    }
    (failed, calls(&arrivals))
}

#[tokio::test(start_paused = true)]
async fn retries_never_return_to_a_backend_the_call_tried() {
    // The table asks for the record: each call's attempts share it.
    let (failed, calls) = retry_over_one_dead_backend(Some(true)).await;
    assert_eq!(failed, 0);
    assert_eq!(calls.len(), 300);
    assert!(calls.iter().all(|call| !repeats(call)), "{calls:?}");
    let retried = calls.iter().filter(|call| call.len() > 1).count();
    assert!(
        retried > 50,
        "the dead backend took first attempts: {retried} retried calls"
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_record_retries_can_land_on_the_dead_backend_again() {
    // Left at its default, the record is off.
    let (failed, calls) = retry_over_one_dead_backend(None).await;
    // One call in 27 sends its three attempts to the dead backend (the loads are equal
    // between sequential calls): about 11 of 300, and the seeded draws give some.
    assert!(failed > 0, "no call failed");
    assert!(calls.iter().any(|call| repeats(call)));
}

#[tokio::test(start_paused = true)]
async fn hedges_go_to_backends_the_call_has_not_tried() {
    let arrivals = Arrivals::default();
    // Equal loads, so that the load alone does not steer hedges off the slow backend.
    let balanced = balanced(
        vec![
            (
                "slow",
                unmeasured(backend("slow", "0", ms(1_000), &arrivals)),
            ),
            ("a", unmeasured(backend("a", "0", ms(5), &arrivals))),
            ("b", unmeasured(backend("b", "0", ms(5), &arrivals))),
        ],
        OutlierDetection::default(),
    );
    // A hedging policy records its call's backends by default. No budget: about a third
    // of these calls are hedged, far past the default budget's 5 %.
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(20))
        .budget(None)
        .build()
        .expect("valid policy");
    let service =
        HedgeLayer::new(Policies::builder().service(SERVICE, policy).build()).layer(balanced);
    let mut slowest = Duration::ZERO;
    for _ in 0..300 {
        let started = tokio::time::Instant::now();
        let response = service
            .clone()
            .oneshot(request(None))
            .await
            .expect("answered");
        assert_eq!(response.headers()["grpc-status"], "0");
        slowest = slowest.max(started.elapsed());
    }
    // A call whose first attempt went to the slow backend is answered by its hedge: 20 ms
    // of hedging delay and 5 ms of a fast backend.
    assert!(slowest <= ms(25), "slowest call {slowest:?}");
    let calls = calls(&arrivals);
    assert_eq!(calls.len(), 300);
    assert!(calls.iter().all(|call| !repeats(call)), "{calls:?}");
    let hedged = calls.iter().filter(|call| call[0] == "slow").count();
    assert!(
        hedged > 50,
        "the slow backend took first attempts: {hedged}"
    );
    assert!(
        calls
            .iter()
            .all(|call| call.len() <= 2 || call[0] == "slow")
    );
}
