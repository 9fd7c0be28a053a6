//! gRFC A96's retry metrics, read back from the OpenTelemetry SDK's in-memory exporter: mock
//! services on tokio's paused clock for the counts and the delay, and the real tonic peer of
//! `tests/common` for a generated client's labels; gRFC A108's custom label on them; the
//! balancer's gRFC A91 outlier-detection counters in `outliers.rs`.

#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "balance")]
mod outliers;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use common::pb::EchoRequest;
use common::pb::echo_client::EchoClient;
use common::{Action, Script, spawn_grpc};
use http::{Request, Response};
use http_body_util::Full;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::data::{
    AggregatedMetrics, HistogramDataPoint, MetricData, ResourceMetrics,
};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{Code, GrpcCodes, HttpStatuses};
use tower_retry_hedge::policy::RetryPolicyBuilder;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::telemetry::{CustomLabel, RetryMetrics};
use tower_retry_hedge::{BoxError, HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy};
use tower_test::mock;

type Req = Request<Full<Bytes>>;
type Res = Response<http_body_util::Empty<Bytes>>;
type Handle = mock::Handle<Req, Res>;

const METHOD: &str = "pkg.Service/Method";

// A96's instruments and A108's label, by the names gRPC gives them, and grpc-java's buckets.
const RETRIES: &str = "grpc.client.call.retries";
const TRANSPARENT_RETRIES: &str = "grpc.client.call.transparent_retries";
const HEDGES: &str = "grpc.client.call.hedges";
const RETRY_DELAY: &str = "grpc.client.call.retry_delay";
const CUSTOM_LABEL_KEY: &str = "grpc.client.call.custom";
const RETRY_BUCKETS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];
const TRANSPARENT_RETRY_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0];
/// gRFC A66's latency buckets, in seconds.
const RETRY_DELAY_BUCKETS: [f64; 41] = [
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];
const AUTHORITY: &str = "greeter.test:50051";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A meter whose measurements can be read back.
struct Recorded {
    exporter: InMemoryMetricExporter,
    provider: SdkMeterProvider,
}

/// One histogram data point, its sum as `f64` whatever the instrument's type.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    labels: BTreeMap<String, String>,
    count: u64,
    sum: f64,
    bounds: Vec<f64>,
    buckets: Vec<u64>,
}

impl Point {
    fn of<T: Copy>(point: &HistogramDataPoint<T>, to_f64: impl Fn(T) -> f64) -> Point {
        Point {
            labels: point
                .attributes()
                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                .collect(),
            count: point.count(),
            sum: to_f64(point.sum()),
            bounds: point.bounds().collect(),
            buckets: point.bucket_counts().collect(),
        }
    }

    fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

impl Recorded {
    fn new() -> Recorded {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Recorded { exporter, provider }
    }

    fn meter(&self) -> Meter {
        self.provider.meter("tower-retry-hedge")
    }

    /// The retry policy for `METHOD`, recording on this meter.
    fn retry_policies(&self) -> Policies {
        Policies::builder()
            .method(METHOD, retry_policy())
            .metrics(&self.meter())
            .build()
    }

    /// What the meter holds now (cumulative since the start).
    fn exported(&self) -> Vec<ResourceMetrics> {
        self.exporter.reset();
        self.provider.force_flush().expect("flush the metrics");
        self.exporter.get_finished_metrics().expect("read metrics")
    }

    /// The names of the instruments that recorded something.
    // The balancer's counters are read in `outliers.rs`, built with the `balance` feature.
    #[cfg_attr(not(feature = "balance"), allow(dead_code))]
    fn names(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for resource in &self.exported() {
            for scope in resource.scope_metrics() {
                names.extend(scope.metrics().map(|m| m.name().to_owned()));
            }
        }
        names
    }

    /// The data points of `u64` counter `name` now: each one's labels and count.
    #[cfg_attr(not(feature = "balance"), allow(dead_code))]
    fn counts(&self, name: &str) -> Vec<(BTreeMap<String, String>, u64)> {
        let mut counts = Vec::new();
        for resource in &self.exported() {
            for scope in resource.scope_metrics() {
                for metric in scope.metrics().filter(|m| m.name() == name) {
                    let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() else {
                        panic!("{name} is not a u64 counter: {:?}", metric.data());
                    };
                    counts.extend(sum.data_points().map(|p| {
                        let labels = p
                            .attributes()
                            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                            .collect();
                        (labels, p.value())
                    }));
                }
            }
        }
        counts.sort();
        counts
    }

    /// The data points of histogram `name` now (cumulative since the start).
    fn points(&self, name: &str) -> Vec<Point> {
        let exported = self.exported();
        let mut points = Vec::new();
        for resource in &exported {
            for scope in resource.scope_metrics() {
                for metric in scope.metrics().filter(|m| m.name() == name) {
                    match metric.data() {
                        AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                            points.extend(h.data_points().map(|p| Point::of(p, |v| v as f64)));
                        }
                        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                            points.extend(h.data_points().map(|p| Point::of(p, |v| v)));
                        }
                        other => panic!("{name} is not a histogram: {other:?}"),
                    }
                }
            }
        }
        points
    }

    /// The one data point of histogram `name`.
    fn point(&self, name: &str) -> Point {
        let points = self.points(name);
        assert_eq!(points.len(), 1, "{name}: {points:#?}");
        points.into_iter().next().unwrap()
    }
}

fn backoff() -> Exponential {
    Exponential::new(ms(100), ms(1000), 2.0, Jitter::None).unwrap()
}

fn retry_policy() -> RetryPolicy {
    retry_policy_with(|builder| builder)
}

/// The retry policy of these tests, customised.
fn retry_policy_with(build: impl FnOnce(RetryPolicyBuilder) -> RetryPolicyBuilder) -> RetryPolicy {
    let builder = RetryPolicy::builder()
        .max_attempts(5)
        .backoff(backoff())
        .retryable(GrpcCodes::from([Code::Unavailable]));
    build(builder).build().unwrap()
}

/// A gRPC request for `pkg.Service/Method` on `greeter.test:50051`.
fn grpc_request() -> Req {
    Request::post(format!("http://{AUTHORITY}/{METHOD}"))
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"hello")))
        .unwrap()
}

fn http_request(uri: &str) -> Req {
    Request::get(uri).body(Full::new(Bytes::new())).unwrap()
}

fn trailers_only(code: Code, pushback: Option<&'static str>) -> Res {
    let mut response = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", code.header_value());
    if let Some(ms) = pushback {
        response = response.header("grpc-retry-pushback-ms", ms);
    }
    response.body(http_body_util::Empty::new()).unwrap()
}

fn grpc_ok() -> Res {
    trailers_only(Code::Ok, None)
}

fn status(code: u16) -> Res {
    Response::builder()
        .status(code)
        .body(http_body_util::Empty::new())
        .unwrap()
}

type Call = tokio::task::JoinHandle<Result<Res, BoxError>>;

/// A call through a retry layer over a mock: the test plays the server.
fn start(policies: &Policies, request: Req) -> (Call, Handle) {
    let (service, handle) = mock::pair::<Req, Res>();
    let svc = RetryLayer::new(policies.clone()).layer(service);
    (tokio::spawn(svc.oneshot(request)), handle)
}

async fn answer(handle: &mut Handle, response: Res) {
    let (_, send) = handle.next_request().await.expect("an attempt");
    send.send_response(response);
}

/// The labels every test call carries.
fn grpc_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("grpc.method".to_owned(), METHOD.to_owned()),
        ("grpc.target".to_owned(), AUTHORITY.to_owned()),
    ])
}

#[tokio::test(start_paused = true)]
async fn a_call_with_two_retries_records_retries_2_under_its_method_and_authority() {
    let recorded = Recorded::new();
    let policies = recorded.retry_policies();
    let (call, mut handle) = start(&policies, grpc_request());
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    let retries = recorded.point(RETRIES);
    assert_eq!((retries.count, retries.sum), (1, 2.0), "{retries:?}");
    assert_eq!(retries.labels, grpc_labels());
    assert_eq!(retries.bounds, RETRY_BUCKETS);
    // Buckets (-inf, 1], (1, 2], …: the value 2 lands in the second.
    assert_eq!(retries.buckets, [0, 1, 0, 0, 0, 0]);
    // A96: no transparent retry and no hedge, so nothing is reported for them.
    assert!(recorded.points(TRANSPARENT_RETRIES).is_empty());
    assert!(recorded.points(HEDGES).is_empty());
    // The two backoffs, 100 and 200 ms, with no attempt in flight.
    let delay = recorded.point(RETRY_DELAY);
    assert_eq!(delay.count, 1);
    assert!((delay.sum - 0.3).abs() < 1e-9, "{delay:?}");
    assert_eq!(delay.labels, grpc_labels());
    assert_eq!(delay.bounds, RETRY_DELAY_BUCKETS);
}

#[tokio::test(start_paused = true)]
async fn three_never_sent_attempts_then_a_success_record_3_transparent_retries_and_no_retry() {
    let recorded = Recorded::new();
    // With gRPC's wait-for-ready, attempts that could not connect are transparent retries.
    let policies = Policies::builder()
        .method(METHOD, retry_policy_with(|b| b.wait_for_ready(true)))
        .metrics(&recorded.meter())
        .build();
    let (call, mut handle) = start(&policies, grpc_request());
    for _ in 0..3 {
        let (_, send) = handle.next_request().await.expect("an attempt");
        send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    }
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    let transparent = recorded.point(TRANSPARENT_RETRIES);
    assert_eq!((transparent.count, transparent.sum), (1, 3.0));
    assert_eq!(transparent.labels, grpc_labels());
    assert_eq!(transparent.bounds, TRANSPARENT_RETRY_BUCKETS);
    // retries = 0: A96 says "if there were no retries, 0 is not reported".
    assert!(recorded.points(RETRIES).is_empty());
    assert!(recorded.points(HEDGES).is_empty());
    // The never-sent resends backed off (100, 200, 400 ms) with nothing in flight.
    let delay = recorded.point(RETRY_DELAY);
    assert!((delay.sum - 0.7).abs() < 1e-9, "{delay:?}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_a_250_ms_pushback_records_a_retry_delay_of_a_quarter_second() {
    let recorded = Recorded::new();
    let policies = recorded.retry_policies();
    let (call, mut handle) = start(&policies, grpc_request());
    answer(&mut handle, trailers_only(Code::Unavailable, Some("250"))).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    let delay = recorded.point(RETRY_DELAY);
    assert_eq!(delay.count, 1);
    assert!((delay.sum - 0.25).abs() < 1e-9, "{delay:?}");
    // 0.25 is a boundary of A66's buckets, and buckets hold their upper bound.
    let bucket = RETRY_DELAY_BUCKETS.iter().position(|&b| b == 0.25).unwrap();
    assert_eq!(delay.buckets[bucket], 1, "{delay:?}");
    assert_eq!(recorded.point(RETRIES).sum, 1.0);
}

#[tokio::test(start_paused = true)]
async fn an_http_route_is_labelled_with_its_name_never_with_its_paths() {
    let recorded = Recorded::new();
    let http = || {
        RetryPolicy::builder()
            .backoff(backoff())
            .retryable(HttpStatuses::default())
            .build()
            .unwrap()
    };
    let policies = Policies::builder()
        .route(Route::prefix("/api").named("items"), http())
        .default_policy(http())
        .metrics(&recorded.meter())
        .build();
    for uri in [
        "http://api.test/api/items/1",
        "http://api.test/api/items/2",
        "http://api.test/api/items/3",
        "http://api.test/elsewhere/4",
    ] {
        let (call, mut handle) = start(&policies, http_request(uri));
        answer(&mut handle, status(503)).await;
        answer(&mut handle, status(200)).await;
        call.await.unwrap().unwrap();
    }

    let mut points = recorded.points(RETRIES);
    points.sort_by(|a, b| a.label("grpc.method").cmp(b.label("grpc.method")));
    let labels: Vec<_> = points
        .iter()
        .map(|p| (p.label("grpc.method"), p.label("grpc.target"), p.count))
        .collect();
    // Three paths under one route: one series. A request outside every route: `other`.
    assert_eq!(
        labels,
        [("items", "api.test", 3), ("other", "api.test", 1)],
        "{points:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedged_call_records_its_hedges_and_no_retry() {
    let recorded = Recorded::new();
    let hedge = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(10))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    let policies = Policies::builder()
        .method(METHOD, hedge)
        .metrics(&recorded.meter())
        .build();
    let (service, mut handle) = mock::pair::<Req, Res>();
    let svc = HedgeLayer::new(policies.clone()).layer(service);
    let call = tokio::spawn(svc.oneshot(grpc_request()));
    // The first attempt hangs; the hedge sent 10 ms later answers.
    let (_, _slow) = handle.next_request().await.expect("the first attempt");
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    let hedges = recorded.point(HEDGES);
    assert_eq!((hedges.count, hedges.sum), (1, 1.0));
    assert_eq!(hedges.labels, grpc_labels());
    assert!(recorded.points(RETRIES).is_empty());
    // The first attempt was in flight the whole time.
    assert_eq!(recorded.point(RETRY_DELAY).sum, 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_call_of_one_attempt_records_nothing() {
    let recorded = Recorded::new();
    let policies = recorded.retry_policies();
    let (call, mut handle) = start(&policies, grpc_request());
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();
    for name in [RETRIES, TRANSPARENT_RETRIES, HEDGES, RETRY_DELAY] {
        assert!(recorded.points(name).is_empty(), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_named_target_replaces_the_authority() {
    let recorded = Recorded::new();
    let policies = Policies::builder()
        .method(METHOD, retry_policy())
        .metrics(RetryMetrics::new(&recorded.meter()).target("dns:///greeter.test:50051"))
        .build();
    let (call, mut handle) = start(&policies, grpc_request());
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();
    assert_eq!(
        recorded.point(RETRIES).label("grpc.target"),
        "dns:///greeter.test:50051"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_it_waits_records_what_it_did() {
    let recorded = Recorded::new();
    let policies = recorded.retry_policies();
    let (call, mut handle) = start(&policies, grpc_request());
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    // The second retry waits out its 200 ms backoff when the caller gives up.
    tokio::time::sleep(ms(50)).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());

    assert_eq!(recorded.point(RETRIES).sum, 1.0);
    // Only the first backoff ended in a send; the wait cut short is not a retry delay.
    assert!((recorded.point(RETRY_DELAY).sum - 0.1).abs() < 1e-9);
}

/// A retried call carrying `label`, if any, through `policies`.
async fn retried_call(policies: &Policies, label: Option<CustomLabel>) {
    let mut request = grpc_request();
    if let Some(label) = label {
        request.extensions_mut().insert(label);
    }
    let (call, mut handle) = start(policies, request);
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn with_the_custom_label_on_each_value_is_a_series_of_its_own() {
    let recorded = Recorded::new();
    let policies = Policies::builder()
        .method(METHOD, retry_policy())
        .metrics(RetryMetrics::new(&recorded.meter()).custom_label(true))
        .build();
    retried_call(&policies, Some(CustomLabel::from_static("checkout"))).await;
    retried_call(&policies, Some(CustomLabel::new(String::from("search")))).await;
    retried_call(&policies, Some(CustomLabel::from_static("checkout"))).await;
    retried_call(&policies, None).await;

    for name in [RETRIES, RETRY_DELAY] {
        let mut points = recorded.points(name);
        points.sort_by(|a, b| a.label(CUSTOM_LABEL_KEY).cmp(b.label(CUSTOM_LABEL_KEY)));
        let series: Vec<_> = points
            .iter()
            .map(|p| (p.labels[CUSTOM_LABEL_KEY].as_str(), p.count))
            .collect();
        // A108: a call without the extension is recorded under the empty string.
        assert_eq!(
            series,
            [("", 1), ("checkout", 2), ("search", 1)],
            "{name}: {points:#?}"
        );
        for point in &points {
            let mut others = point.labels.clone();
            others.remove(CUSTOM_LABEL_KEY);
            assert_eq!(others, grpc_labels(), "{name}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn with_the_custom_label_off_the_extension_is_ignored() {
    let recorded = Recorded::new();
    // `Policies::builder().metrics(&meter)` and `RetryMetrics::new` leave it off.
    let policies = recorded.retry_policies();
    retried_call(&policies, Some(CustomLabel::from_static("checkout"))).await;
    retried_call(&policies, None).await;

    let retries = recorded.point(RETRIES);
    assert_eq!(retries.count, 2);
    assert_eq!(retries.labels, grpc_labels());
    assert_eq!(recorded.point(RETRY_DELAY).labels, grpc_labels());
}

/// A generated tonic client over the real peer: a client built `with_origin` sends the
/// authority, and the method is the generated one.
#[tokio::test]
async fn a_tonic_client_records_its_retries_under_the_generated_method_and_the_peer() {
    let recorded = Recorded::new();
    let peer = spawn_grpc(Script::new().call(
        7,
        [
            Action::fail(tonic::Code::Unavailable),
            Action::fail(tonic::Code::Unavailable),
        ],
    ))
    .await;
    let fast = Exponential::new(ms(1), ms(10), 2.0, Jitter::None).unwrap();
    let policy = RetryPolicy::builder()
        .max_attempts(4)
        .backoff(fast)
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    let policies = Policies::builder()
        .service("test.echo.Echo", policy)
        .metrics(&recorded.meter())
        .build();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies))
        .service(peer.channel().await);
    let origin: http::Uri = peer.uri().parse().unwrap();
    let mut client = EchoClient::with_origin(svc, origin);
    let request = EchoRequest {
        message: "hello".to_owned(),
        payload: Vec::new(),
        call: 7,
    };
    let reply = tokio::time::timeout(Duration::from_secs(30), client.unary(request))
        .await
        .expect("the call ends")
        .expect("the third attempt succeeds");
    assert_eq!(reply.into_inner().message, "hello");
    assert_eq!(peer.recorder().attempt_count(7), 3);

    let retries = recorded.point(RETRIES);
    assert_eq!((retries.count, retries.sum), (1, 2.0));
    assert_eq!(retries.label("grpc.method"), "test.echo.Echo/Unary");
    assert_eq!(retries.label("grpc.target"), peer.addr().to_string());
    peer.shutdown().await;
}
