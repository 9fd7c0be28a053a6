//! The spans and events the crate emits, in a test binary of their own: the subscriber is the
//! process-wide default, so no other test's thread can race tracing's per-callsite interest
//! cache. The tests here take turns (`SERIAL`), each reading only what it emitted.
//!
//! `the_documented_table_is_what_is_emitted` holds the table in `src/telemetry/mod.rs` to
//! what a set of calls, one or more per row, actually emits.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use tower::{Layer, ServiceExt};
use tower_retry_hedge::body::ReplayBody;
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::throttle::Throttle;
use tower_retry_hedge::{
    BoxError, BufferLimits, HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy,
};
use tower_test::mock;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[path = "../retry/support.rs"]
mod support;

use support::*;

/// The table this test holds the crate to.
const TELEMETRY_DOCS: &str = include_str!("../../src/telemetry/mod.rs");

/// One span opened, span field recorded, or event emitted by this crate.
#[derive(Clone, Debug)]
struct Seen {
    /// `span`, `record` (a value recorded on an open span) or `event`.
    kind: &'static str,
    /// The span's name, or the event's message.
    name: String,
    level: tracing::Level,
    /// The callsite's fields (for an event, without `message`).
    fields: BTreeSet<String>,
    /// The values given, in order.
    values: Vec<(String, String)>,
}

impl Seen {
    /// `kind name: field=value ...`, as the first test reads it.
    fn line(&self) -> String {
        let mut line = match self.kind {
            "record" => "record:".to_owned(),
            kind => format!("{kind} {}:", self.name),
        };
        for (field, value) in &self.values {
            line.push_str(&format!(" {field}={value}"));
        }
        line
    }

    fn value(&self, field: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(name, _)| name == field)
            .map(|(_, value)| value.as_str())
    }
}

#[derive(Default)]
struct Values(Vec<(String, String)>);

impl Visit for Values {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

/// Everything this crate emitted.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<Seen>>>);

impl Captured {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn push(&self, seen: Seen) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(seen);
    }
}

fn field_names(fields: &tracing::field::FieldSet) -> BTreeSet<String> {
    fields
        .iter()
        .map(|f| f.name().to_owned())
        .filter(|name| name != "message")
        .collect()
}

impl Seen {
    /// What a callsite of this crate emitted (its `message`, for an event, is its name);
    /// `None` for other crates' callsites.
    fn of(
        kind: &'static str,
        metadata: &tracing::Metadata<'_>,
        record: impl FnOnce(&mut Values),
    ) -> Option<Seen> {
        if !metadata.target().starts_with("tower_retry_hedge") {
            return None;
        }
        let mut values = Values::default();
        record(&mut values);
        let mut values = values.0;
        let name = match values.iter().position(|(field, _)| field == "message") {
            Some(i) if kind == "event" => values.remove(i).1,
            _ => metadata.name().to_owned(),
        };
        Some(Seen {
            kind,
            name,
            level: *metadata.level(),
            fields: field_names(metadata.fields()),
            values,
        })
    }
}

impl<S> tracing_subscriber::Layer<S> for Captured
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        if let Some(seen) = Seen::of("span", attrs.metadata(), |v| attrs.record(v)) {
            self.push(seen);
        }
    }

    fn on_record(&self, id: &Id, record: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if let Some(seen) = Seen::of("record", span.metadata(), |v| record.record(v)) {
            self.push(seen);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if let Some(seen) = Seen::of("event", event.metadata(), |v| event.record(v)) {
            self.push(seen);
        }
    }
}

/// The tests take turns, each with the capture to itself.
static SERIAL: Mutex<()> = Mutex::new(());

fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::registry().with(captured.clone());
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        captured
    })
}

/// Runs `test` on a paused-clock runtime and gives what the crate emitted meanwhile.
fn run<F: Future<Output = ()>>(test: impl FnOnce() -> F) -> Vec<Seen> {
    let _turn: MutexGuard<'_, ()> = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let captured = captured();
    captured.take();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(test());
    captured.take()
}

#[test]
fn a_span_per_call_and_an_event_per_retry() {
    let seen = run(|| async {
        let (call, mut handle) = start(policies(policy(3)), grpc_request("x"));
        answer(&mut handle, trailers_only(Code::Unavailable, Some("40"))).await;
        answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
        answer(&mut handle, grpc_ok()).await;
        call.await.unwrap().unwrap();
    });
    let lines: Vec<String> = seen.iter().map(Seen::line).collect();
    let spans: Vec<_> = lines
        .iter()
        .filter(|l| l.starts_with("span retry:"))
        .collect();
    assert_eq!(spans.len(), 1, "{lines:#?}");
    assert!(
        spans[0].contains(r#"path=/test.Echo/Unary"#),
        "{}",
        spans[0]
    );

    let retries: Vec<_> = lines.iter().filter(|l| l.contains("retrying")).collect();
    assert_eq!(retries.len(), 2, "{lines:#?}");
    assert!(retries[0].contains("attempt=2") && retries[0].contains("delay=40ms"));
    assert!(retries[0].contains(r#"reason="pushback""#));
    assert!(retries[1].contains("attempt=3") && retries[1].contains("delay=100ms"));
    assert!(retries[1].contains(r#"reason="backoff""#));

    let resend_counts: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("http.request.resend_count"))
        .collect();
    assert_eq!(resend_counts.len(), 2, "{lines:#?}");
    assert!(resend_counts[0].ends_with("http.request.resend_count=1"));
    assert!(resend_counts[1].ends_with("http.request.resend_count=2"));
}

/// A service config's unknown keys: one `WARN` naming the first ten with their near misses,
/// counting the rest, bounded in length however many and however long the keys; nothing for
/// a clean config, a strict parse, or a config that fails. It lives here rather than beside
/// the parser because a parse on another test thread, with no subscriber, can cache the
/// callsite's interest as "never" while a scoped subscriber is being set.
#[test]
fn unknown_config_keys_are_logged_once_at_warn() {
    use tower_retry_hedge::ServiceConfig;

    const TYPOS: &str = r#"{
      "retryThrotling": {"maxTokens": 10, "tokenRatio": 0.1},
      "methodConfig": [{
        "name": [{"service": "pkg.Search", "methdo": "Query"}],
        "hedgingPolicy": {"maxAttempts": 3, "hedgeDelay": "0.5s",
                          "nonFatalStatusCodes": ["UNAVAILABLE"]}
      }]
    }"#;
    let warnings = |seen: Vec<Seen>| -> Vec<Seen> {
        assert!(seen.iter().all(|s| s.kind == "event"), "{seen:#?}");
        seen
    };

    let seen = warnings(run(|| async {
        ServiceConfig::from_json(TYPOS).unwrap();
    }));
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let event = &seen[0];
    assert_eq!(event.name, "service config: unknown fields ignored");
    assert_eq!(event.level, tracing::Level::WARN);
    assert_eq!(event.value("count"), Some("3"));
    assert_eq!(
        event.value("keys"),
        Some(
            "retryThrotling (did you mean retryThrottling?), \
             methodConfig[0].name[0].methdo (did you mean method?), \
             methodConfig[0].hedgingPolicy.hedgeDelay (did you mean hedgingDelay?)"
        )
    );

    // Bounded: a key of 100 000 characters and 19 999 more keys make one short line.
    let keys: Vec<String> = std::iter::once(format!(r#""{}": 0"#, "k".repeat(100_000)))
        .chain((1..20_000).map(|i| format!(r#""unknown{i}": {i}"#)))
        .collect();
    let hostile = format!("{{{}}}", keys.join(","));
    let seen = warnings(run(|| async {
        ServiceConfig::from_json(&hostile).unwrap();
    }));
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0].value("count"), Some("20000"));
    let listed = seen[0].value("keys").unwrap();
    assert!(listed.ends_with(", and 19990 more"), "{listed}");
    assert!(listed.len() < 2000, "{} bytes", listed.len());

    // Nothing for a clean config, a strict parse, or a config that fails.
    let seen = warnings(run(|| async {
        ServiceConfig::from_json(r#"{"methodConfig": []}"#).unwrap();
        let _ = ServiceConfig::from_json_strict(TYPOS);
        let _ = ServiceConfig::from_json(r#"{"x": 1, "retryThrottling": {}}"#);
    }));
    assert!(seen.is_empty(), "{seen:#?}");
}

#[test]
fn each_attempt_has_a_span_with_a6_attributes_and_its_outcome() {
    let seen = run(|| async {
        let (call, mut handle) = start(policies(waiting_policy(3)), grpc_request("x"));
        let (_, send) = handle.next_request().await.expect("the first attempt");
        send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
        answer(&mut handle, grpc_ok()).await;
        call.await.unwrap().unwrap();
    });
    let attempts: Vec<String> = seen
        .iter()
        .filter(|s| s.name == "attempt" && s.kind == "span")
        .map(|s| {
            let value = |f| s.value(f).unwrap_or("-").to_owned();
            format!(
                "{} {} {} {}",
                value("attempt"),
                value("previous-rpc-attempts"),
                value("transparent-retry"),
                value("hedge")
            )
        })
        .collect();
    // The transparent resend repeats the first attempt's number: A6 leaves it out of
    // `previous-rpc-attempts`.
    assert_eq!(
        attempts,
        ["1 0 false false", "2 0 true false", "3 1 false false"]
    );
    let outcomes: Vec<_> = seen
        .iter()
        .filter(|s| s.kind == "record" && s.name == "attempt")
        .filter_map(|s| s.value("outcome"))
        .collect();
    assert_eq!(
        outcomes,
        [r#""not sent""#, r#""retryable""#, r#""success""#]
    );
}

/// A row of the table: what the docs promise.
#[derive(Debug)]
struct Row {
    kind: String,
    name: String,
    level: String,
    fields: BTreeSet<String>,
    /// Every backticked word of the description: the values a field may take.
    words: BTreeSet<String>,
}

/// The words between backticks in `text`.
fn backticked(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn table() -> Vec<Row> {
    TELEMETRY_DOCS
        .lines()
        .filter_map(|line| line.strip_prefix("//! | "))
        .filter(|row| row.starts_with("span |") || row.starts_with("event |"))
        .map(|row| {
            let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 5, "a row of five cells: {row}");
            Row {
                kind: cells[0].to_owned(),
                name: cells[1].trim_matches('`').to_owned(),
                level: cells[2].to_owned(),
                fields: backticked(cells[3]),
                words: backticked(cells[4]),
            }
        })
        .collect()
}

type Res = Response<http_body_util::Empty<Bytes>>;
type Streamed = BoxBody<Bytes, BoxError>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A body of these chunks, then `error` if any; no size hint.
fn streamed(chunks: &[&'static [u8]], error: Option<&'static str>) -> Streamed {
    let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::from_static(c))))
        .collect();
    if let Some(error) = error {
        frames.push(Err(error.into()));
    }
    BoxBody::new(StreamBody::new(futures_util::stream::iter(frames)))
}

fn grpc_post<B>(body: B) -> Request<B> {
    Request::post(METHOD)
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap()
}

fn hedge_policy(max_attempts: u32) -> HedgePolicy {
    HedgePolicy::builder()
        .max_attempts(max_attempts)
        .delay(ms(10))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap()
}

/// A call with a streamed body through a retry layer with these limits, whose first
/// attempt reads its body before answering `response`.
async fn streamed_call(limits: BufferLimits, body: Streamed, response: Res) {
    let policies = Policies::builder()
        .method(METHOD, policy(3))
        .buffer_limits(limits)
        .build();
    let (service, mut handle) = mock::pair::<Request<Streamed>, Res>();
    let call = tokio::spawn(
        RetryLayer::new(policies)
            .layer(service)
            .oneshot(grpc_post(body)),
    );
    let (request, send) = handle.next_request().await.expect("an attempt");
    let _ = request.into_body().collect().await;
    send.send_response(response);
    let _ = call.await.unwrap();
}

/// Calls that between them make the crate emit every row of the table.
async fn every_row() {
    // `retry`, `attempt`, `retrying` (pushback, backoff), `committed` (success) and the body
    // committed to the attempt that answered.
    let (call, mut handle) = start(policies(policy(3)), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Unavailable, Some("40"))).await;
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    // `transparent retry`; then `not retrying` (max attempts), `committed` (fatal).
    let (call, mut handle) = start(policies(waiting_policy(2)), grpc_request("x"));
    let (_, send) = handle.next_request().await.expect("an attempt");
    send.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    call.await.unwrap().unwrap();
    let (call, mut handle) = start(policies(policy(3)), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Internal, None)).await;
    call.await.unwrap().unwrap();

    // `pushback over the cap`, then `not retrying` (pushback: stop).
    let capped = Policies::builder()
        .method(METHOD, policy(3))
        .max_pushback(ms(1000))
        .build();
    let (call, mut handle) = start(capped, grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Unavailable, Some("5000"))).await;
    call.await.unwrap().unwrap();

    // `throttled`: two tokens, one failure leaves one, not above half.
    let throttled = Policies::builder()
        .method(METHOD, policy(3))
        .throttle(Throttle::new(2, 0.1).unwrap())
        .build();
    let (call, mut handle) = start(throttled, grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    call.await.unwrap().unwrap();

    // `per-attempt timeout` (the attempt's outcome: `timed out`), and a retry that answers.
    let timed = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff(100, 1000))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .per_attempt_timeout(ms(50))
        .build()
        .unwrap();
    let (call, mut handle) = start(policies(timed), grpc_request("x"));
    let (_hangs, _reply) = handle.next_request().await.expect("the first attempt");
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    // `deadline exceeded`: the only attempt outlives the call's `grpc-timeout`.
    let mut request = grpc_request("x");
    request
        .headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("100m"));
    let (call, mut handle) = start(policies(policy(3)), request);
    let (_hangs, _reply) = handle.next_request().await.expect("the attempt");
    assert!(call.await.unwrap().is_err());

    // `hedge`, `hedge sent`, `next hedge`, and an attempt cancelled when another wins.
    let hedged = Policies::builder().method(METHOD, hedge_policy(3)).build();
    let (service, mut handle) = mock::pair::<Req, Res>();
    let call = tokio::spawn(
        HedgeLayer::new(hedged)
            .layer(service)
            .oneshot(grpc_request("x")),
    );
    let (_slow, _reply) = handle.next_request().await.expect("the first attempt");
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    // The replay body: committed to the attempt whose answer is returned; outgrowing the
    // buffer commits the call (`committed`, body); a failing source; a body too large to
    // record; an id never given out.
    streamed_call(
        BufferLimits::default(),
        streamed(&[b"1234"], None),
        grpc_ok(),
    )
    .await;
    streamed_call(
        BufferLimits::new(8, 1024),
        streamed(&[b"123456", b"789012"], None),
        grpc_ok(),
    )
    .await;
    streamed_call(
        BufferLimits::default(),
        streamed(&[b"1234"], Some("source broke")),
        trailers_only(Code::Internal, None),
    )
    .await;
    let known_size = Full::new(Bytes::from_static(b"far too long")).map_err(|e| match e {});
    streamed_call(
        BufferLimits::new(4, 1024),
        BoxBody::new(known_size),
        grpc_ok(),
    )
    .await;
    let template = ReplayBody::try_new(Full::new(Bytes::from_static(b"x")), &Default::default())
        .map_err(|_| "a small body can be replayed")
        .unwrap();
    assert!(!template.commit_to(999));

    #[cfg(feature = "balance")]
    balance_drops_a_failing_endpoint();
    #[cfg(feature = "balance")]
    balance_ejects_an_outlier_and_brings_it_back().await;

    // `hedge over budget`: a budget with no share and no floor lets no hedge through.
    let budget = tower_retry_hedge::throttle::HedgeBudget::new(ms(1000), 0, 0.0).unwrap();
    let budgeted = HedgePolicy::builder()
        .max_attempts(2)
        .delay(ms(10))
        .budget(budget)
        .build()
        .unwrap();
    let policies = Policies::builder().method(METHOD, budgeted).build();
    let (service, mut handle) = mock::pair::<Req, Res>();
    let call = tokio::spawn(
        HedgeLayer::new(policies)
            .layer(service)
            .oneshot(grpc_request("x")),
    );
    let (_, reply) = handle.next_request().await.expect("the first attempt");
    tokio::time::sleep(ms(20)).await;
    reply.send_response(grpc_ok());
    call.await.unwrap().unwrap();

    // `attempt let finish`: no resets allowed, so the first attempt, which lost to the
    // hedge, is let finish.
    let finishing = Policies::builder()
        .method(METHOD, hedge_policy(2))
        .resets_per_second(Some(0))
        .build();
    let (service, mut handle) = mock::pair::<Req, Res>();
    let call = tokio::spawn(
        HedgeLayer::new(finishing)
            .layer(service)
            .oneshot(grpc_request("x")),
    );
    let (_, slow) = handle.next_request().await.expect("the first attempt");
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();
    slow.send_response(grpc_ok());

    // `HTTP/2 reset guard closed the connection`: an attempt fails as h2 fails the calls of
    // a connection its own guard closed.
    let (call, mut handle) = start(support::policies(policy(2)), grpc_request("x"));
    let (_, reply) = handle.next_request().await.expect("the attempt");
    reply.send_error(GuardClosed);
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    // `service config: unknown fields ignored` (outside any call).
    let config = tower_retry_hedge::ServiceConfig::from_json(r#"{"methodConfg": []}"#).unwrap();
    assert_eq!(config.ignored().len(), 1);
}

/// `balance: dropping an endpoint that failed`.
#[cfg(feature = "balance")]
fn balance_drops_a_failing_endpoint() {
    use tower::load::Constant;
    use tower_retry_hedge::balance::Balance;

    let (good, _good) = mock::pair::<Req, Res>();
    let (bad, mut bad_handle) = mock::pair::<Req, Res>();
    bad_handle.send_error("connection refused");
    let endpoints =
        tower::discover::ServiceList::new([Constant::new(good, 0), Constant::new(bad, 0)]);
    let mut balance = mock::Spawn::new(Balance::<_, Req>::new(endpoints));
    let _ = balance.poll_ready();
    assert_eq!(balance.get_ref().len(), 1);
}

/// Two dead backends of three, under outlier detection that ejects on a run of three
/// failures: the first is ejected (`backend ejected`); the second may not be while the first
/// is out (`outlier not ejected`: at most one of three); 30 s later the first comes back.
#[cfg(feature = "balance")]
async fn balance_ejects_an_outlier_and_brings_it_back() {
    use tower::Service;
    use tower::discover::ServiceList;
    use tower::load::{CompleteOnResponse, PendingRequests};
    use tower::util::BoxService;
    use tower_retry_hedge::balance::{Balance, OutlierDetection};

    let backend = |status: &'static str| {
        let service = tower::service_fn(move |_: Req| async move {
            let response = Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", status)
                .body(Full::new(Bytes::new()))
                .expect("a valid response");
            Ok::<_, std::convert::Infallible>(response)
        });
        PendingRequests::new(BoxService::new(service), CompleteOnResponse::default())
    };
    let detection = OutlierDetection::builder()
        .consecutive_failures(Some(3))
        .failure_percentage(None)
        .build()
        .unwrap();
    let backends = ServiceList::new(vec![backend("14"), backend("14"), backend("0")]);
    let mut balance = Balance::with_seed(backends, 3).outlier_detection(detection);
    let outliers = balance.outliers();
    for _ in 0..60 {
        let ready = balance.ready().await.unwrap();
        let _ = ready.call(grpc_request("x")).await;
    }
    assert_eq!(outliers.ejected().len(), 1);
    tokio::time::sleep(Duration::from_secs(31)).await;
    let _ = balance.ready().await.unwrap().call(grpc_request("x")).await;
    assert!(outliers.returns() >= 1);
}

/// What a call on a connection that `h2`'s own reset guard closed fails with: its `GOAWAY`,
/// as `h2::Error` shows it.
#[derive(Debug)]
struct GuardClosed;

impl std::fmt::Display for GuardClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(r#"connection error detected: detected excessive load generating behavior (b"too_many_internal_resets")"#)
    }
}

impl std::error::Error for GuardClosed {}

#[test]
fn a_reset_guard_that_closed_the_connection_is_logged_once_and_counted_each_time() {
    let table = policies(policy(2));
    let seen = run(|| async {
        for _ in 0..3 {
            let (call, mut handle) = start(table.clone(), grpc_request("x"));
            let (_, reply) = handle.next_request().await.expect("the attempt");
            reply.send_error(GuardClosed);
            answer(&mut handle, grpc_ok()).await;
            call.await.unwrap().unwrap();
        }
    });
    let warnings: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.name == "HTTP/2 reset guard closed the connection")
        .collect();
    assert_eq!(warnings.len(), 1, "{seen:#?}");
    let warning = warnings[0];
    assert_eq!(warning.level, tracing::Level::WARN);
    assert_eq!(
        warning.value("guard"),
        Some(r#""too_many_internal_resets""#)
    );
    assert_eq!(
        warning.value("setting"),
        Some(r#""client max_local_error_reset_streams""#)
    );
    assert!(
        warning
            .value("advice")
            .is_some_and(|advice| advice.contains("http2_max_concurrent_reset_streams")),
        "{warning:?}"
    );
    let snapshot = table.stats().snapshot();
    assert_eq!(snapshot.methods[METHOD].reset_guard_failures, 3);
}

#[test]
fn the_documented_table_is_what_is_emitted() {
    let rows = table();
    assert!(rows.len() > 10, "the table was not found: {rows:#?}");
    let seen = run(every_row);

    let mut emitted: BTreeMap<(String, String), &Seen> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.kind != "record") {
        let row = rows
            .iter()
            .find(|r| r.kind == s.kind && r.name == s.name)
            .unwrap_or_else(|| panic!("not in the table: {s:?}"));
        assert_eq!(row.level, s.level.to_string(), "{s:?}");
        assert_eq!(row.fields, s.fields, "the fields of {} {}", s.kind, s.name);
        emitted.insert((s.kind.to_owned(), s.name.clone()), s);
    }
    for row in &rows {
        if row.name.starts_with("balance:") && cfg!(not(feature = "balance")) {
            continue;
        }
        assert!(
            emitted.contains_key(&(row.kind.clone(), row.name.clone())),
            "no call emitted {} `{}`",
            row.kind,
            row.name
        );
    }

    // Every value of `reason` and `outcome` is one the row names.
    for s in &seen {
        for field in ["reason", "outcome"] {
            let Some(value) = s.value(field) else {
                continue;
            };
            let value = value.trim_matches('"');
            let kind = if s.kind == "record" { "span" } else { s.kind };
            let row = rows
                .iter()
                .find(|r| r.kind == kind && r.name == s.name)
                .expect("checked above");
            assert!(
                row.words.contains(value),
                "{kind} `{}`: {field} `{value}` is not documented",
                s.name
            );
        }
    }
    // The values the calls above must have shown.
    let values: BTreeSet<String> = seen
        .iter()
        .flat_map(|s| {
            ["reason", "outcome"].map(|f| s.value(f).map(|v| v.trim_matches('"').to_owned()))
        })
        .flatten()
        .collect();
    for expected in [
        "backoff",
        "pushback",
        "not sent",
        "max attempts",
        "pushback: stop",
        "success",
        "fatal",
        "body",
        "timed out",
        "cancelled",
        "retryable",
    ] {
        assert!(
            values.contains(expected),
            "{expected} not seen in {values:?}"
        );
    }
}
