//! `RetryInterceptor` over a scripted `Invoke` on tokio's paused clock: the rules a real
//! server cannot show through `grpc` 0.9's transport (pushback, whose trailers' metadata it
//! drops; attempts dropped before their headers, which it cannot reset), and exact times.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use grpc::client::interceptor::InvokeExt as _;
use grpc::client::{CallOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions, SendStream};
use grpc::core::{RecvMessage, RequestHeaders, ResponseHeaders, SendMessage, Trailers};
use grpc::metadata::MetadataMap;
use grpc::{StatusCodeError, StatusError};
use tokio::time::Instant;
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::grpc_channel::RetryInterceptor;
use tower_retry_hedge::throttle::HedgeBudget;
use tower_retry_hedge::{HedgePolicy, Policies};

use super::{Raw, read_all};

const METHOD: &str = "/test.echo.Echo/Unary";

/// How a scripted attempt answers.
#[derive(Clone, Debug)]
enum Answer {
    /// A Trailers-Only failure, with a raw `grpc-retry-pushback-ms` if any.
    Fail(StatusCodeError, Option<&'static str>),
    /// A Trailers-Only failure after this long.
    FailAfter(Duration, StatusCodeError),
    /// Response headers, then OK.
    Ok,
    /// Nothing, ever.
    Hang,
}

/// What the scripted channel saw.
#[derive(Debug, Default)]
struct Log {
    /// When each attempt started, and its `grpc-previous-rpc-attempts`.
    started: Vec<(Instant, Option<String>)>,
    /// The attempts whose receive stream was dropped before it ended.
    dropped: Vec<usize>,
}

/// An `Invoke` that answers attempt `n` as `answers[n]` says (past the end: OK).
#[derive(Clone)]
struct Scripted {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    log: Arc<Mutex<Log>>,
}

impl Scripted {
    fn new(answers: impl IntoIterator<Item = Answer>) -> Scripted {
        Scripted {
            answers: Arc::new(Mutex::new(answers.into_iter().collect())),
            log: Arc::default(),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Invoke for Scripted {
    type SendStream = Sink;
    type RecvStream = Scripted1;

    async fn invoke(&self, headers: RequestHeaders, _: CallOptions) -> (Sink, Scripted1) {
        let previous = headers
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().to_owned());
        let index = {
            let mut log = self.log();
            log.started.push((Instant::now(), previous));
            log.started.len() - 1
        };
        let answer = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .unwrap_or(Answer::Ok);
        let recv = Scripted1 {
            answer,
            step: 0,
            index,
            log: Arc::clone(&self.log),
        };
        (Sink, recv)
    }
}

/// A send stream that takes every message.
struct Sink;

impl SendStream for Sink {
    async fn send(&mut self, _: &dyn SendMessage, _: SendOptions) -> Result<(), ()> {
        Ok(())
    }
}

/// One scripted attempt's receive stream.
struct Scripted1 {
    answer: Answer,
    step: u8,
    index: usize,
    log: Arc<Mutex<Log>>,
}

impl RecvStream for Scripted1 {
    async fn recv(&mut self, _: &mut dyn RecvMessage) -> ResponseStreamItem {
        self.step += 1;
        match (&self.answer, self.step) {
            (Answer::Hang, _) => std::future::pending().await,
            (Answer::FailAfter(after, code), 1) => {
                tokio::time::sleep(*after).await;
                ResponseStreamItem::Trailers(Trailers::new(Err(StatusError::new(
                    *code, "scripted",
                ))))
            }
            (Answer::Fail(code, pushback), 1) => {
                let mut metadata = MetadataMap::new();
                if let Some(pushback) = pushback {
                    metadata.insert("grpc-retry-pushback-ms", pushback.parse().expect("ascii"));
                }
                ResponseStreamItem::Trailers(
                    Trailers::new(Err(StatusError::new(*code, "scripted"))).with_metadata(metadata),
                )
            }
            (Answer::Ok, 1) => ResponseStreamItem::Headers(ResponseHeaders::new()),
            (Answer::Ok, 2) => ResponseStreamItem::Trailers(Trailers::new(Ok(()))),
            _ => ResponseStreamItem::StreamClosed,
        }
    }
}

impl Drop for Scripted1 {
    fn drop(&mut self) {
        let ended = match self.answer {
            Answer::Hang => false,
            Answer::Fail(..) | Answer::FailAfter(..) => self.step >= 1,
            Answer::Ok => self.step >= 2,
        };
        if !ended {
            self.log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .dropped
                .push(self.index);
        }
    }
}

fn retry(max_attempts: u32) -> RetryInterceptor {
    let json = format!(
        r#"{{"methodConfig": [{{
            "name": [{{"service": "test.echo.Echo"}}],
            "retryPolicy": {{
              "maxAttempts": {max_attempts}, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
              "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]
            }}
        }}]}}"#
    );
    let config: ServiceConfig = json.parse().expect("valid service config");
    RetryInterceptor::new(config.policies())
}

fn hedge(max_attempts: u32, delay: &str) -> RetryInterceptor {
    let json = format!(
        r#"{{"methodConfig": [{{
            "name": [{{"service": "test.echo.Echo"}}],
            "hedgingPolicy": {{
              "maxAttempts": {max_attempts}, "hedgingDelay": "{delay}",
              "nonFatalStatusCodes": ["UNAVAILABLE"]
            }}
        }}]}}"#
    );
    let config: ServiceConfig = json.parse().expect("valid service config");
    RetryInterceptor::new(config.policies())
}

/// A unary call to the policy's method through `invoker`.
async fn unary(invoker: &impl Invoke, options: CallOptions) -> super::Seen {
    unary_to(invoker, METHOD, options).await
}

/// A unary call to `method` through `invoker`.
async fn unary_to(invoker: &impl Invoke, method: &str, options: CallOptions) -> super::Seen {
    let headers = RequestHeaders::new().with_method_name(method);
    let (mut send, mut recv) = invoker.invoke(headers, options).await;
    send.send(
        &Raw(bytes::Bytes::from_static(b"m")),
        SendOptions::new().with_final_msg(true),
    )
    .await
    .expect("queued");
    read_all(&mut recv).await
}

#[tokio::test(start_paused = true)]
async fn pushback_sets_the_next_attempts_time_exactly() {
    let channel = Scripted::new([Answer::Fail(StatusCodeError::Unavailable, Some("500"))]);
    let invoker = channel.clone().with_interceptor(retry(3));
    let start = Instant::now();

    let seen = unary(&invoker, CallOptions::new()).await;

    assert!(seen.status.is_ok(), "{seen:?}");
    let log = channel.log();
    let times: Vec<Duration> = log.started.iter().map(|(at, _)| *at - start).collect();
    // Not the 1 ms backoff: the server's 500 ms.
    assert_eq!(times, [Duration::ZERO, Duration::from_millis(500)]);
    assert_eq!(log.started[1].1.as_deref(), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn a_negative_or_garbled_pushback_stops_the_retries() {
    for pushback in ["-1", "soon"] {
        let channel = Scripted::new([Answer::Fail(StatusCodeError::Unavailable, Some(pushback))]);
        let invoker = channel.clone().with_interceptor(retry(5));

        let seen = unary(&invoker, CallOptions::new()).await;

        assert_eq!(
            seen.code(),
            Some(StatusCodeError::Unavailable),
            "{pushback}"
        );
        assert_eq!(channel.log().started.len(), 1, "{pushback}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_hedge_that_wins_drops_the_other_attempts() {
    let channel = Scripted::new([Answer::Hang, Answer::Ok, Answer::Hang]);
    let invoker = channel.clone().with_interceptor(hedge(3, "0.01s"));
    let start = Instant::now();

    let seen = unary(&invoker, CallOptions::new()).await;

    assert!(seen.status.is_ok(), "{seen:?}");
    assert_eq!(seen.previous_attempts().as_deref(), Some("1"));
    let log = channel.log();
    let times: Vec<Duration> = log.started.iter().map(|(at, _)| *at - start).collect();
    // The second attempt answered at once: no third was sent.
    assert_eq!(times, [Duration::ZERO, Duration::from_millis(10)]);
    assert_eq!(log.dropped, [0], "the first attempt was cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_backup_the_budget_refuses_leaves_the_hedge_a_failure_owes() {
    // 3 attempts 150 ms apart, a budget with no hedges, no throttle: the backup due at
    // 150 ms is refused, and the first attempt's UNAVAILABLE at 300 ms still sends the
    // second at once, which answers OK.
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(Duration::from_millis(150))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(HedgeBudget::new(Duration::from_secs(10), 0, 0.0).expect("valid"))
        .build()
        .expect("valid");
    let policies = Policies::builder()
        .service("test.echo.Echo", policy)
        .build();
    let channel = Scripted::new([
        Answer::FailAfter(Duration::from_millis(300), StatusCodeError::Unavailable),
        Answer::Ok,
    ]);
    let invoker = channel
        .clone()
        .with_interceptor(RetryInterceptor::new(policies.clone()));
    let start = Instant::now();

    let seen = unary(&invoker, CallOptions::new()).await;

    assert!(seen.status.is_ok(), "{seen:?}");
    assert_eq!(Instant::now() - start, Duration::from_millis(300));
    assert_eq!(seen.previous_attempts().as_deref(), Some("1"));
    let log = channel.log();
    let times: Vec<Duration> = log.started.iter().map(|(at, _)| *at - start).collect();
    assert_eq!(times, [Duration::ZERO, Duration::from_millis(300)]);
    let snapshot = policies.stats().snapshot();
    assert_eq!(snapshot.methods[METHOD].hedges_over_budget, 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_receive_stream_drops_every_attempt_and_sends_no_more() {
    let channel = Scripted::new([Answer::Hang, Answer::Hang, Answer::Hang, Answer::Hang]);
    let invoker = channel.clone().with_interceptor(hedge(4, "0.01s"));
    let headers = RequestHeaders::new().with_method_name(METHOD);
    let (_send, recv) = invoker.invoke(headers, CallOptions::new()).await;
    tokio::time::sleep(Duration::from_millis(25)).await;
    assert_eq!(channel.log().started.len(), 3);

    drop(recv);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let log = channel.log();
    assert_eq!(log.started.len(), 3, "no hedge after the drop");
    let mut dropped = log.dropped.clone();
    dropped.sort_unstable();
    assert_eq!(dropped, [0, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_the_call_on_time_with_deadline_exceeded() {
    let channel = Scripted::new([
        Answer::Fail(StatusCodeError::Unavailable, None),
        Answer::Hang,
    ]);
    let invoker = channel.clone().with_interceptor(retry(5));
    let start = Instant::now();
    let mut options = CallOptions::new();
    options.set_deadline((start + Duration::from_millis(100)).into_std());

    let seen = unary(&invoker, options).await;

    assert_eq!(
        seen.code(),
        Some(StatusCodeError::DeadlineExceeded),
        "{seen:?}"
    );
    assert_eq!(Instant::now() - start, Duration::from_millis(100));
    assert_eq!(channel.log().started.len(), 2);
    assert_eq!(
        channel.log().dropped,
        [1],
        "the attempt in flight was cancelled"
    );
}

#[cfg(feature = "opentelemetry")]
#[tokio::test(start_paused = true)]
async fn a_call_with_two_retries_records_a96_retries_2_under_its_method() {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
    use tower_retry_hedge::classify::{Code, GrpcCodes};
    use tower_retry_hedge::{Policies, RetryPolicy};

    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let policy = RetryPolicy::builder()
        .max_attempts(4)
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("valid policy");
    let policies = Policies::builder()
        .service("test.echo.Echo", policy)
        .metrics(&provider.meter("tower-retry-hedge"))
        .build();
    let channel = Scripted::new([
        Answer::Fail(StatusCodeError::Unavailable, None),
        Answer::Fail(StatusCodeError::Unavailable, None),
    ]);
    let invoker = channel
        .clone()
        .with_interceptor(RetryInterceptor::new(policies));

    let seen = unary(&invoker, CallOptions::new()).await;
    assert!(seen.status.is_ok(), "{seen:?}");
    // The call's state goes with its task, just after the answer.
    tokio::task::yield_now().await;

    provider.force_flush().expect("flush the metrics");
    let exported = exporter.get_finished_metrics().expect("read metrics");
    let mut points = Vec::new();
    for resource in &exported {
        for scope in resource.scope_metrics() {
            for metric in scope
                .metrics()
                .filter(|m| m.name() == "grpc.client.call.retries")
            {
                let AggregatedMetrics::U64(MetricData::Histogram(histogram)) = metric.data() else {
                    panic!("retries is not a u64 histogram: {:?}", metric.data());
                };
                points.extend(histogram.data_points().map(|p| {
                    let method = p
                        .attributes()
                        .find(|kv| kv.key.as_str() == "grpc.method")
                        .map(|kv| kv.value.to_string());
                    (method, p.count(), p.sum())
                }));
            }
        }
    }
    assert_eq!(
        points,
        [(Some("test.echo.Echo/Unary".to_owned()), 1, 2)],
        "one call, two retries, under its method"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_holds_for_a_method_without_a_policy() {
    // `grpc` 0.9 enforces no deadline: the interceptor does, policy or not.
    let channel = Scripted::new([Answer::Hang]);
    let invoker = channel.clone().with_interceptor(retry(3));
    let start = Instant::now();
    let mut options = CallOptions::new();
    options.set_deadline((start + Duration::from_millis(80)).into_std());
    let seen = unary_to(&invoker, "/test.echo.Other/Call", options).await;

    assert_eq!(
        seen.code(),
        Some(StatusCodeError::DeadlineExceeded),
        "{seen:?}"
    );
    assert_eq!(Instant::now() - start, Duration::from_millis(80));
    assert_eq!(channel.log().started.len(), 1);
    assert_eq!(channel.log().dropped, [0]);
}

/// The same script through the tower layer: each attempt answers as `answers` says, as a
/// gRPC-over-HTTP/2 response (a Trailers-Only failure, or headers that begin an OK answer).
#[derive(Clone)]
struct ScriptedService(Arc<Mutex<VecDeque<Answer>>>);

impl tower::Service<http::Request<http_body_util::Full<bytes::Bytes>>> for ScriptedService {
    type Response = http::Response<http_body_util::Full<bytes::Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<http_body_util::Full<bytes::Bytes>>) -> Self::Future {
        let answer = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .unwrap_or(Answer::Ok);
        Box::pin(async move {
            let failed = |code: StatusCodeError| {
                http::Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", (code as i32).to_string())
                    .body(http_body_util::Full::default())
                    .expect("a valid response")
            };
            Ok(match answer {
                Answer::Hang => std::future::pending().await,
                Answer::FailAfter(after, code) => {
                    tokio::time::sleep(after).await;
                    failed(code)
                }
                Answer::Fail(code, pushback) => {
                    let mut response = failed(code);
                    if let Some(pushback) = pushback {
                        let value = http::HeaderValue::from_static(pushback);
                        response
                            .headers_mut()
                            .insert("grpc-retry-pushback-ms", value);
                    }
                    response
                }
                Answer::Ok => http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(b"m")))
                    .expect("a valid response"),
            })
        })
    }
}

/// Item 6 of the engine's books: a call gives the same attempt count, statistics, call and
/// attempt spans and events whichever driver runs it, since both report what the engine
/// recorded.
#[tokio::test(start_paused = true)]
async fn both_drivers_keep_the_same_books_of_the_same_calls() {
    let unavailable = StatusCodeError::Unavailable;
    let scripts: [(&str, Vec<Answer>, ServiceConfig); 3] = [
        (
            "two retries, then OK",
            vec![
                Answer::Fail(unavailable, None),
                Answer::Fail(unavailable, None),
            ],
            config(
                r#""retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}"#,
            ),
        ),
        (
            "retries run out",
            vec![Answer::Fail(unavailable, Some("20")); 3],
            config(
                r#""retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}"#,
            ),
        ),
        (
            "the third hedge wins, the first fails late",
            vec![
                Answer::FailAfter(Duration::from_millis(25), unavailable),
                Answer::Hang,
                Answer::Ok,
            ],
            config(
                r#""hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.01s", "nonFatalStatusCodes": ["UNAVAILABLE"]}"#,
            ),
        ),
    ];
    // A first pass registers every callsite the calls reach. The other tests of this binary
    // run the drivers on other threads with no subscriber, and a callsite registered there
    // while a trace is being installed here can keep the interest "never" (tracing-core
    // computes it from the dispatchers alive at registration): its spans and events would
    // vanish from the trace. Once every callsite is registered, each install recomputes their
    // interest with its subscriber alive, and no registration can race it.
    for (_, answers, config) in &scripts {
        one_call_through_each_driver(answers, config).await;
    }
    for (name, answers, config) in &scripts {
        let calls = one_call_through_each_driver(answers, config).await;
        let [
            (grpc_attempts, grpc_previous, grpc_policies, grpc_trace),
            (tower_attempts, tower_previous, tower_policies, tower_trace),
        ] = calls;
        assert_eq!(grpc_attempts, tower_attempts, "{name}: attempts");
        assert_eq!(
            grpc_previous, tower_previous,
            "{name}: grpc-previous-rpc-attempts"
        );
        let books = |policies: &Policies| policies.stats().snapshot().methods;
        assert_eq!(
            format!("{:?}", books(&grpc_policies)),
            format!("{:?}", books(&tower_policies)),
            "{name}: statistics"
        );
        assert!(
            !books(&grpc_policies).is_empty(),
            "{name}: the calls were counted"
        );
        let attempts = grpc_trace.attempts();
        assert_eq!(attempts, tower_trace.attempts(), "{name}: attempt spans");
        assert_eq!(
            grpc_trace.calls(),
            tower_trace.calls(),
            "{name}: call spans"
        );
        assert_eq!(grpc_trace.events(), tower_trace.events(), "{name}: events");
        assert!(
            !grpc_trace.events().is_empty(),
            "{name}: events were traced"
        );
        assert_eq!(attempts.len(), grpc_attempts, "{name}: a span per attempt");
        assert!(
            attempts.iter().all(|attempt| attempt.contains("outcome=")),
            "{name}: every attempt span closed with its outcome: {attempts:#?}"
        );
    }
}

/// What one call of `answers` left through each driver (the `grpc` interceptor, then the
/// tower layer), each under its own policies from `config` and its own trace: the attempts
/// sent, the answer's `grpc-previous-rpc-attempts`, the policies (their statistics) and the
/// trace.
async fn one_call_through_each_driver(
    answers: &[Answer],
    config: &ServiceConfig,
) -> [(usize, Option<String>, Policies, AttemptTrace); 2] {
    use tower::{Layer as _, ServiceExt as _};
    use tower_retry_hedge::RetryLayer;

    // Through the `grpc` interceptor.
    let grpc_policies = config.policies();
    let channel = Scripted::new(answers.to_vec());
    let invoker = channel
        .clone()
        .with_interceptor(RetryInterceptor::new(grpc_policies.clone()));
    let grpc_trace = AttemptTrace::default();
    let seen = {
        let _traced = grpc_trace.install();
        unary(&invoker, CallOptions::new()).await
    };
    let grpc_attempts = channel.log().started.len();
    let grpc_previous = seen.previous_attempts();

    // Through the tower layer.
    let tower_policies = config.policies();
    let service = RetryLayer::new(tower_policies.clone()).layer(ScriptedService(Arc::new(
        Mutex::new(answers.to_vec().into()),
    )));
    let request = http::Request::post(format!("http://localhost{METHOD}"))
        .header("content-type", "application/grpc")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"m")))
        .expect("a valid request");
    let tower_trace = AttemptTrace::default();
    let response = {
        let _traced = tower_trace.install();
        service.oneshot(request).await.expect("infallible")
    };
    let tower_previous = response
        .headers()
        .get("grpc-previous-rpc-attempts")
        .map(|v| v.to_str().expect("ascii").to_owned());
    let tower_attempts = response
        .extensions()
        .get::<tower_retry_hedge::metadata::Attempts>()
        .map_or(1, |a| a.counted() as usize);
    [
        (grpc_attempts, grpc_previous, grpc_policies, grpc_trace),
        (tower_attempts, tower_previous, tower_policies, tower_trace),
    ]
}

/// The spans and events of the calls traced while it is installed (on this thread): each
/// `attempt` span and each call span (`retry`, `hedge`) as its fields, and each event as its
/// message and fields.
#[derive(Clone, Default)]
struct AttemptTrace(Arc<Mutex<AttemptSpans>>);

#[derive(Default)]
struct AttemptSpans {
    /// Each span's name and fields, in the order the spans were opened.
    fields: Vec<(&'static str, Vec<(String, String)>)>,
    /// Where each open span's fields are, by span id.
    open: std::collections::HashMap<tracing::span::Id, usize>,
    /// Each event's fields (its message among them), in order.
    events: Vec<Vec<(String, String)>>,
}

impl AttemptTrace {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        use tracing_subscriber::layer::SubscriberExt as _;
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    /// Each attempt span, as `name=value` fields sorted by name.
    fn attempts(&self) -> Vec<String> {
        self.spans(|name| name == "attempt")
    }

    /// Each call span, as its name and its `name=value` fields sorted by name.
    fn calls(&self) -> Vec<String> {
        self.spans(|name| name != "attempt")
    }

    fn spans(&self, wanted: impl Fn(&str) -> bool) -> Vec<String> {
        let spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        spans
            .fields
            .iter()
            .filter(|(name, _)| wanted(name))
            .map(|(name, fields)| format!("{name}: {}", sorted(fields, &[])))
            .collect()
    }

    /// Each event of the call's rules, as its `name=value` fields sorted by name; the value
    /// of a `delay` (drawn with jitter, by each driver's own generator) as `_`. The replay
    /// body's own events are left out: the interceptor records the messages, where the layer
    /// over this test's service clones a `Full` body, which records nothing.
    fn events(&self) -> Vec<String> {
        let spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        spans
            .events
            .iter()
            .map(|fields| sorted(fields, &["delay"]))
            .filter(|event| !event.contains("message=request body"))
            .collect()
    }
}

/// `fields` as `name=value` sorted by name, the values of `hidden` fields as `_`.
fn sorted(fields: &[(String, String)], hidden: &[&str]) -> String {
    let mut fields: Vec<String> = fields
        .iter()
        .map(|(name, value)| match hidden.contains(&name.as_str()) {
            true => format!("{name}=_"),
            false => format!("{name}={value}"),
        })
        .collect();
    fields.sort();
    fields.join(" ")
}

/// A span's fields, as text.
struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Fields<'_> {
    /// Sets `name` to `value`: a field recorded again keeps its last value.
    fn set(&mut self, name: &str, value: String) {
        match self.0.iter_mut().find(|(field, _)| field == name) {
            Some((_, old)) => *old = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }
}

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.set(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.set(field.name(), format!("{value:?}"));
    }
}

/// Whether a span of this name is one the trace keeps: an attempt's, or a call's.
fn traced(name: &str) -> bool {
    matches!(name, "attempt" | "retry" | "hedge")
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AttemptTrace {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let name = attrs.metadata().name();
        if !traced(name) {
            return;
        }
        let mut spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        spans.fields.push((name, fields));
        let index = spans.fields.len() - 1;
        spans.open.insert(id.clone(), index);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        record: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&index) = spans.open.get(id) {
            record.record(&mut Fields(&mut spans.fields[index].1));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if !event.metadata().target().starts_with("tower_retry_hedge") {
            return;
        }
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        spans.events.push(fields);
    }

    fn on_close(&self, id: tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut spans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        spans.open.remove(&id);
    }
}

/// A service config naming the echo service with `policy`.
fn config(policy: &str) -> ServiceConfig {
    let json =
        format!(r#"{{"methodConfig": [{{"name": [{{"service": "test.echo.Echo"}}], {policy}}}]}}"#);
    json.parse().expect("valid service config")
}
