//! The span per call and the event per attempt, in a test binary of their own: the
//! subscriber is the process-wide default, so no other test's thread can race tracing's
//! per-callsite interest cache.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Layer as _, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};
use tower_test::mock;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};

type Req = Request<Full<Bytes>>;
type Res = Response<()>;
type Handle = mock::Handle<Req, Res>;
type CallHandle = tokio::task::JoinHandle<Result<Res, BoxError>>;

const METHOD: &str = "/test.Echo/Unary";

fn backoff(initial_ms: u64, max_ms: u64) -> Exponential {
    Exponential::new(
        Duration::from_millis(initial_ms),
        Duration::from_millis(max_ms),
        2.0,
        Jitter::None,
    )
    .unwrap()
}

fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(max_attempts)
        .backoff(backoff(100, 1000))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap()
}

fn policies(policy: RetryPolicy) -> Policies {
    Policies::builder().method(METHOD, policy).build()
}

fn grpc_request(body: &'static str) -> Req {
    Request::post(METHOD)
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

fn trailers_only(code: Code, pushback: Option<&'static str>) -> Res {
    let mut response = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", code.header_value());
    if let Some(p) = pushback {
        response = response.header("grpc-retry-pushback-ms", p);
    }
    response.body(()).unwrap()
}

fn grpc_ok() -> Res {
    Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

/// Starts a call through the layer; the test plays the server through the handle.
fn start(policies: Policies, request: Req) -> (CallHandle, Handle) {
    let (mock, handle) = mock::pair::<Req, Res>();
    let svc = RetryLayer::new(policies).layer(mock);
    (tokio::spawn(svc.oneshot(request)), handle)
}

/// Answers the next attempt with `response`, returning the request and when it arrived.
async fn answer(handle: &mut Handle, response: Res) -> (Req, Instant) {
    let (request, send) = handle.next_request().await.expect("an attempt");
    let at = Instant::now();
    send.send_response(response);
    (request, at)
}

/// Everything the layer emitted, as `name: field=value ...` lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<String>>>);

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut line = Line(format!("span {}:", attrs.metadata().name()));
        attrs.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut line = Line("record:".to_string());
        values.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut line = Line("event:".to_string());
        event.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_span_per_call_and_an_event_per_retry() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let (call, mut handle) = start(policies(policy(3)), grpc_request("x"));
    answer(&mut handle, trailers_only(Code::Unavailable, Some("40"))).await;
    answer(&mut handle, trailers_only(Code::Unavailable, None)).await;
    answer(&mut handle, grpc_ok()).await;
    call.await.unwrap().unwrap();

    let lines = captured.0.lock().unwrap().clone();
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
    assert!(retries[0].contains("pushback=true"));
    assert!(retries[1].contains("attempt=3") && retries[1].contains("delay=100ms"));
    assert!(retries[1].contains("pushback=false"));

    let resend_counts: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("http.request.resend_count"))
        .collect();
    assert_eq!(resend_counts.len(), 2, "{lines:#?}");
    assert!(resend_counts[0].ends_with("http.request.resend_count=1"));
    assert!(resend_counts[1].ends_with("http.request.resend_count=2"));
}
