//! The span per call and the event per attempt, in a test binary of their own: the
//! subscriber is the process-wide default, so no other test's thread can race tracing's
//! per-callsite interest cache.

use std::sync::{Arc, Mutex};

use tower_retry_hedge::classify::Code;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};

#[path = "../retry/support.rs"]
mod support;

use support::*;

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
