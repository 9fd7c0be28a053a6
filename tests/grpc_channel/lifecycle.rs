//! What a call through `RetryInterceptor` leaves behind, on the paused clock over a scripted
//! `Invoke` that records each attempt's request stream: no attempt after a commit, no sender
//! task or buffered byte after the call, and the deadline past the response headers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use grpc::client::interceptor::InvokeExt as _;
use grpc::client::{CallOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions, SendStream};
use grpc::core::{RecvMessage, RequestHeaders, ResponseHeaders, SendMessage, Trailers};
use grpc::{StatusCodeError, StatusError};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::grpc_channel::RetryInterceptor;
use tower_retry_hedge::{BufferLimits, Policies};

use super::{Raw, RawReply};

const METHOD: &str = "/test.echo.Echo/Unary";

/// How a scripted attempt answers.
#[derive(Clone, Copy, Debug)]
enum How {
    /// UNAVAILABLE once its request stream has brought a message.
    FailAfterMessage,
    /// UNAVAILABLE at once.
    FailNow,
    /// Response headers, then nothing.
    HeadersThenHang,
    /// Nothing.
    Hang,
}

/// Per attempt: the messages its request stream brought, and whether that stream is gone.
#[derive(Debug, Default)]
struct Log {
    messages: Vec<usize>,
    request_dropped: Vec<bool>,
}

#[derive(Clone)]
struct Mock {
    script: Arc<Vec<How>>,
    log: Arc<Mutex<Log>>,
}

impl Mock {
    fn new(script: impl IntoIterator<Item = How>) -> Mock {
        Mock {
            script: Arc::new(script.into_iter().collect()),
            log: Arc::default(),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Invoke for Mock {
    type SendStream = Requests;
    type RecvStream = Answers;

    async fn invoke(&self, _: RequestHeaders, _: CallOptions) -> (Requests, Answers) {
        let index = {
            let mut log = self.log();
            log.messages.push(0);
            log.request_dropped.push(false);
            log.messages.len() - 1
        };
        let how = self.script.get(index).copied().unwrap_or(How::Hang);
        let got = Arc::new(Notify::new());
        let requests = Requests {
            index,
            log: Arc::clone(&self.log),
            got: Arc::clone(&got),
        };
        (requests, Answers { how, got, step: 0 })
    }
}

struct Requests {
    index: usize,
    log: Arc<Mutex<Log>>,
    got: Arc<Notify>,
}

impl SendStream for Requests {
    async fn send(&mut self, _: &dyn SendMessage, _: SendOptions) -> Result<(), ()> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .messages[self.index] += 1;
        self.got.notify_one();
        Ok(())
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .request_dropped[self.index] = true;
    }
}

struct Answers {
    how: How,
    got: Arc<Notify>,
    step: u8,
}

impl RecvStream for Answers {
    async fn recv(&mut self, _: &mut dyn RecvMessage) -> ResponseStreamItem {
        self.step += 1;
        let unavailable = || {
            ResponseStreamItem::Trailers(Trailers::new(Err(StatusError::new(
                StatusCodeError::Unavailable,
                "scripted",
            ))))
        };
        match (self.how, self.step) {
            (How::FailAfterMessage, 1) => {
                self.got.notified().await;
                unavailable()
            }
            (How::FailNow, 1) => unavailable(),
            (How::HeadersThenHang, 1) => ResponseStreamItem::Headers(ResponseHeaders::new()),
            (How::Hang | How::HeadersThenHang, _) => std::future::pending().await,
            _ => ResponseStreamItem::StreamClosed,
        }
    }
}

/// The table for the echo service with `policy` (a JSON `retryPolicy` or `hedgingPolicy`
/// member) and `limits`.
fn policies(policy: &str, limits: BufferLimits) -> Policies {
    let json =
        format!(r#"{{"methodConfig": [{{"name": [{{"service": "test.echo.Echo"}}], {policy}}}]}}"#);
    let config: ServiceConfig = json.parse().expect("valid service config");
    let policy = config
        .policies()
        .lookup(&http::Method::POST, METHOD)
        .cloned()
        .expect("a policy");
    Policies::builder()
        .service("test.echo.Echo", policy)
        .buffer_limits(limits)
        .build()
}

const RETRY: &str = r#""retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s",
    "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}"#;

fn start(mock: &Mock, policies: &Policies) -> impl Invoke + use<> {
    mock.clone()
        .with_interceptor(RetryInterceptor::new(policies.clone()))
}

#[tokio::test(start_paused = true)]
async fn no_attempt_starts_after_the_body_committed() {
    // 16 bytes per call: the 100-byte message commits the call to the first attempt, whose
    // non-fatal failure would otherwise send the next hedge at once.
    let policies = policies(
        r#""hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "10s",
            "nonFatalStatusCodes": ["UNAVAILABLE"]}"#,
        BufferLimits::new(16, 1 << 20),
    );
    let mock = Mock::new([How::FailAfterMessage, How::Hang]);
    let invoker = start(&mock, &policies);
    let headers = RequestHeaders::new().with_method_name(METHOD);
    let (mut send, mut recv) = invoker.invoke(headers, CallOptions::new()).await;
    send.send(
        &Raw(Bytes::from(vec![7; 100])),
        SendOptions::new().with_final_msg(true),
    )
    .await
    .expect("queued");

    let first = recv.recv(&mut RawReply::default()).await;

    let ResponseStreamItem::Trailers(trailers) = first else {
        panic!("not trailers: {first:?}");
    };
    assert_eq!(
        trailers.status().as_ref().err().map(StatusError::code),
        Some(StatusCodeError::Unavailable)
    );
    assert_eq!(
        mock.log().messages,
        [1],
        "one attempt, sent the message once"
    );
    assert_eq!(policies.buffer_limits().in_use(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_receive_stream_stops_every_sender_and_frees_the_buffer() {
    let policies = policies(RETRY, BufferLimits::default());
    let mock = Mock::new([How::FailNow, How::FailNow, How::Hang]);
    let invoker = start(&mock, &policies);
    let headers = RequestHeaders::new().with_method_name(METHOD);
    let (mut send, recv) = invoker.invoke(headers, CallOptions::new()).await;
    // The request stream stays open: the senders wait for more.
    send.send(&Raw(Bytes::from_static(b"one")), SendOptions::new())
        .await
        .expect("queued");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(mock.log().messages, [1, 1, 1]);
    assert!(policies.buffer_limits().in_use() > 0);

    drop(recv);
    tokio::time::sleep(Duration::from_millis(1)).await;

    assert_eq!(mock.log().request_dropped, [true, true, true]);
    assert_eq!(policies.buffer_limits().in_use(), 0);
    let late = send
        .send(&Raw(Bytes::from_static(b"two")), SendOptions::new())
        .await;
    assert_eq!(late, Err(()), "the call is over");
}

#[tokio::test(start_paused = true)]
async fn a_call_that_failed_keeps_no_sender_and_no_buffered_byte() {
    let policies = policies(RETRY, BufferLimits::default());
    let mock = Mock::new([How::FailNow, How::FailNow, How::FailNow]);
    let invoker = start(&mock, &policies);
    let headers = RequestHeaders::new().with_method_name(METHOD);
    let (mut send, mut recv) = invoker.invoke(headers, CallOptions::new()).await;
    send.send(&Raw(Bytes::from_static(b"one")), SendOptions::new())
        .await
        .expect("queued");

    let first = recv.recv(&mut RawReply::default()).await;
    assert!(
        matches!(first, ResponseStreamItem::Trailers(_)),
        "{first:?}"
    );
    tokio::time::sleep(Duration::from_millis(1)).await;

    assert_eq!(mock.log().request_dropped, [true, true, true]);
    assert_eq!(policies.buffer_limits().in_use(), 0);
    let before = mock.log().messages.clone();
    let late = send
        .send(&Raw(Bytes::from(vec![1; 10])), SendOptions::new())
        .await;
    assert_eq!(late, Err(()), "no attempt takes messages any more");
    assert_eq!(mock.log().messages, before);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_holds_after_the_response_headers() {
    let policies = policies(RETRY, BufferLimits::default());
    let mock = Mock::new([How::HeadersThenHang]);
    let invoker = start(&mock, &policies);
    let headers = RequestHeaders::new().with_method_name(METHOD);
    let started = Instant::now();
    let mut options = CallOptions::new();
    options.set_deadline((started + Duration::from_millis(100)).into_std());
    let (mut send, mut recv) = invoker.invoke(headers, options).await;
    send.send(
        &Raw(Bytes::from_static(b"m")),
        SendOptions::new().with_final_msg(true),
    )
    .await
    .expect("queued");

    let first = recv.recv(&mut RawReply::default()).await;
    assert!(matches!(first, ResponseStreamItem::Headers(_)), "{first:?}");
    let second = recv.recv(&mut RawReply::default()).await;

    let ResponseStreamItem::Trailers(trailers) = second else {
        panic!("not trailers: {second:?}");
    };
    assert_eq!(
        trailers.status().as_ref().err().map(StatusError::code),
        Some(StatusCodeError::DeadlineExceeded)
    );
    assert_eq!(Instant::now() - started, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        mock.log().request_dropped,
        [true],
        "the attempt is cancelled"
    );
}
