//! A retried call whose request body fails at its source commits the call, inside the
//! transport task that pulled the failure, to the attempt that was sending it; that attempt
//! is answered 503 at about the same time. The call must end with that attempt's result (the
//! 503, or the attempt's error: on HTTP/1.1 it carries the body's error; on HTTP/2 hyper
//! reports the reset it made for it), never with an error saying that no result was left, and
//! must send the request once. The tallies are printed; run with `--nocapture` to see them.
//!
//! The requests are POSTs, which the policy does not repeat (503 is fatal for them): were
//! they PUTs, a 503 that reached the call before the body failed would be retried, rightly,
//! and "sent once" would not hold. The call's result goes through the same path either way.
//!
//! The server is a small hyper server of this file's own: it answers 503 without reading the
//! request body (the scripted peer of `tests/common` reads every body to its end first), and
//! it tells the client's body when to fail, so that the failure and the 503 cross on the wire.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::{ServiceBuilder, ServiceExt as _};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::HttpStatuses;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};

use super::common::{CALL_HEADER, http_client, http2_client};
use super::{NO_RESULT, chain_has, chain_text, guard};

type Body = UnsyncBoxBody<Bytes, BoxError>;

/// How many calls each test makes.
const CALLS: usize = 200;

/// Request header telling the server when to make the body fail (see [`Trigger`]).
const TRIGGER_HEADER: &str = "x-trigger";

/// The error the request body's source fails with.
#[derive(Debug)]
struct SourceFailed;

impl fmt::Display for SourceFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the upload's source failed")
    }
}

impl std::error::Error for SourceFailed {}

/// When the body fails, relative to the server's 503.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// Right after its first chunk, on its own.
    AtOnce,
    /// When the server has the request head, just before it answers.
    OnHead,
    /// When the server has read the first chunk, just before it answers.
    OnChunk,
}

impl Trigger {
    const ALL: [Trigger; 3] = [Trigger::AtOnce, Trigger::OnHead, Trigger::OnChunk];

    fn name(self) -> &'static str {
        match self {
            Trigger::AtOnce => "at-once",
            Trigger::OnHead => "on-head",
            Trigger::OnChunk => "on-chunk",
        }
    }
}

/// What the server keeps: the requests it saw per call, and the triggers of bodies that wait
/// for the server's word to fail.
#[derive(Default)]
struct Books {
    attempts: Mutex<HashMap<String, usize>>,
    triggers: Mutex<HashMap<String, oneshot::Sender<()>>>,
}

impl Books {
    fn attempts(&self, call: &str) -> usize {
        self.attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(call)
            .copied()
            .unwrap_or(0)
    }

    fn fire(&self, call: &str) {
        let trigger = self
            .triggers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(call);
        if let Some(trigger) = trigger {
            let _ = trigger.send(());
        }
    }
}

/// A hyper server (HTTP/1.1 and HTTP/2) on 127.0.0.1 answering every request 503 without
/// reading its body to the end.
struct Server503 {
    addr: SocketAddr,
    books: Arc<Books>,
    task: JoinHandle<()>,
}

impl Server503 {
    async fn spawn() -> Server503 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        let books = Arc::new(Books::default());
        let shared = Arc::clone(&books);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let books = Arc::clone(&shared);
                let service = service_fn(move |request| answer_503(Arc::clone(&books), request));
                tokio::spawn(async move {
                    // Connections broken by the clients' failing bodies are part of the test.
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server503 { addr, books, task }
    }

    fn url(&self) -> String {
        format!("http://{}/upload", self.addr)
    }
}

impl Drop for Server503 {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer_503(
    books: Arc<Books>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (call, trigger) = (header(CALL_HEADER), header(TRIGGER_HEADER));
    *books
        .attempts
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(call.clone())
        .or_default() += 1;
    let mut body = request.into_body();
    match trigger.as_str() {
        "on-head" => books.fire(&call),
        "on-chunk" => {
            // The first chunk, or whatever ends the body first.
            let _ = body.frame().await;
            books.fire(&call);
        }
        _ => {}
    }
    let mut response = Response::new(Full::new(Bytes::from_static(b"busy")));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    Ok(response)
}

/// A body of one chunk and then its source's failure, which waits for `trigger` if given.
fn failing_body(trigger: Option<oneshot::Receiver<()>>) -> Body {
    let chunk = futures_util::stream::once(async {
        Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"the first chunk")))
    });
    let failure = futures_util::stream::once(async move {
        if let Some(trigger) = trigger {
            // A dropped trigger (the server never saw the request) fails the body too.
            let _ = trigger.await;
        }
        Err::<Frame<Bytes>, BoxError>(Box::new(SourceFailed))
    });
    StreamBody::new(chunk.chain(failure)).boxed_unsync()
}

/// Every path retried on 503, up to 3 attempts, 10 ms apart (for idempotent methods only).
fn policies() -> Policies {
    let backoff = Exponential::new(
        Duration::from_millis(10),
        Duration::from_millis(10),
        2.0,
        Jitter::None,
    )
    .expect("valid backoff");
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff)
        .retryable(HttpStatuses::default())
        .build()
        .expect("valid policy");
    Policies::builder()
        .route(Route::prefix("/"), policy)
        .build()
}

/// What the calls ended with.
#[derive(Debug, Default)]
struct Tally {
    status_503: usize,
    source_error: usize,
    transport_error: usize,
    no_result: usize,
    other: Vec<String>,
    resent: Vec<String>,
}

/// Makes [`CALLS`] calls through the retry layer over `client`, each with a body that fails
/// at one of the [`Trigger`] points, and tallies what they ended with.
async fn run(client: Client<HttpConnector, Body>) -> Tally {
    let server = Server503::spawn().await;
    let policies = policies();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(policies.clone()))
        .service(client);
    let mut tally = Tally::default();
    for n in 0..CALLS {
        let trigger = Trigger::ALL[n % Trigger::ALL.len()];
        let call = n.to_string();
        let waiting = match trigger {
            Trigger::AtOnce => None,
            Trigger::OnHead | Trigger::OnChunk => {
                let (fire, wait) = oneshot::channel();
                server
                    .books
                    .triggers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(call.clone(), fire);
                Some(wait)
            }
        };
        let request = Request::builder()
            .method(Method::POST)
            .uri(server.url())
            .header(CALL_HEADER, call.as_str())
            .header(TRIGGER_HEADER, trigger.name())
            .body(failing_body(waiting))
            .expect("a valid request");
        let result = guard(service.clone().oneshot(request)).await;
        let label = format!("call {n} ({})", trigger.name());
        let answered = match result {
            Ok(response) if response.status() == StatusCode::SERVICE_UNAVAILABLE => {
                tally.status_503 += 1;
                true
            }
            Ok(response) => {
                tally
                    .other
                    .push(format!("{label}: status {}", response.status()));
                true
            }
            Err(error) if chain_has::<SourceFailed>(&*error) => {
                tally.source_error += 1;
                false
            }
            // The attempt's own transport error: on HTTP/2 hyper resets the stream of a body
            // that failed, and the response future fails with that reset, not with the body's
            // error; on HTTP/1.1 the connection may break first.
            Err(error) if chain_has::<hyper::Error>(&*error) => {
                if chain_text(&*error).contains(NO_RESULT) {
                    tally.no_result += 1;
                } else {
                    tally.transport_error += 1;
                }
                false
            }
            Err(error) => {
                let text = chain_text(&*error);
                if text.contains(NO_RESULT) {
                    tally.no_result += 1;
                } else {
                    tally.other.push(format!("{label}: error {text}"));
                }
                false
            }
        };
        let seen = server.books.attempts(&call);
        if seen > 1 || (answered && seen != 1) {
            tally
                .resent
                .push(format!("{label}: the server saw {seen} requests"));
        }
    }
    assert_eq!(policies.buffer_limits().in_use(), 0, "replay buffers held");
    tally
}

fn check(protocol: &str, tally: &Tally) {
    eprintln!("{protocol}: {tally:?}");
    assert!(
        tally.no_result == 0 && tally.other.is_empty() && tally.resent.is_empty(),
        "{protocol}: of {CALLS} calls whose body failed while their attempt was answered \
         503, {} ended with {NO_RESULT:?} (503: {}, the body's error: {}, another error of \
         the attempt's transport: {}); other results: {:?}; sent more than once: {:?}",
        tally.no_result,
        tally.status_503,
        tally.source_error,
        tally.transport_error,
        tally.other,
        tally.resent,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_a_body_failing_as_its_attempt_is_answered_503_returns_that_attempts_result() {
    let tally = run(http_client::<Body>()).await;
    check("HTTP/1.1", &tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_a_body_failing_as_its_attempt_is_answered_503_returns_that_attempts_result() {
    let tally = run(http2_client::<Body>()).await;
    check("HTTP/2", &tally);
}
