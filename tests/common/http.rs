//! A scriptable HTTP peer (HTTP/1.1 and HTTP/2 prior knowledge, hyper 1 +
//! hyper-util): it reads each request's whole body, recording exactly the
//! bytes received, then answers as an [`HttpScript`] says.
//!
//! Requests are grouped into calls by their `x-call` header (absent: `"0"`).
//! Every response carries `x-peer-call` and `x-peer-attempt` (the zero-based
//! attempt index the peer saw).
//!
//! ```ignore
//! let peer = spawn_http(HttpScript::new().call("0", [HttpAction::retry_after(503, "1")])).await;
//! let client = http_client::<Full<Bytes>>();
//! let response = client.request(Request::post(peer.url("/echo")).body(Full::from("hi"))?).await?;
//! assert_eq!(response.status(), 503);
//! peer.shutdown().await;
//! ```

use std::collections::HashMap;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::http::{Method, Request, Response, StatusCode, Uri, Version};
use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::{Attempt, AttemptGuard, Recorder};

/// Request header naming the call an HTTP request belongs to.
pub const CALL_HEADER: &str = "x-call";

/// Response header echoing the call the peer filed the request under.
pub const PEER_CALL_HEADER: &str = "x-peer-call";

/// Response header with the zero-based attempt index the peer saw.
pub const PEER_ATTEMPT_HEADER: &str = "x-peer-attempt";

type BoxError = Box<dyn StdError + Send + Sync>;

/// What the peer does with one request (after reading its whole body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpAction {
    /// 200 with the request body echoed back.
    Ok,
    /// This status, these extra headers, an empty body.
    Status {
        /// The status code (an invalid one is answered with 500).
        status: u16,
        /// Extra response headers, e.g. `("retry-after", "2")`.
        headers: Vec<(String, String)>,
    },
    /// Wait (on the tokio clock), then do the next action.
    Delay(Duration, Box<HttpAction>),
    /// Never answer, until the client gives up or the peer shuts down (then
    /// 503 and [`HttpOutcome::ShutDown`]).
    Hang,
    /// Answer nothing and fail the exchange: HTTP/1.1 closes the connection,
    /// HTTP/2 resets the stream.
    Abort,
}

impl HttpAction {
    /// This status, no extra headers.
    pub fn status(status: u16) -> Self {
        Self::Status {
            status,
            headers: Vec::new(),
        }
    }

    /// This status with a `Retry-After` header holding `value` verbatim.
    pub fn retry_after(status: u16, value: impl Into<String>) -> Self {
        Self::status(status).header("retry-after", value)
    }

    /// Adds a response header to a [`HttpAction::Status`] (also through a
    /// [`HttpAction::Delay`]); other actions are returned unchanged.
    pub fn header(self, name: impl Into<String>, value: impl Into<String>) -> Self {
        match self {
            Self::Status {
                status,
                mut headers,
            } => {
                headers.push((name.into(), value.into()));
                Self::Status { status, headers }
            }
            Self::Delay(delay, then) => Self::Delay(delay, Box::new(then.header(name, value))),
            other => other,
        }
    }

    /// Wait `delay`, then do `then`.
    pub fn delay(delay: Duration, then: HttpAction) -> Self {
        Self::Delay(delay, Box::new(then))
    }
}

/// Per call (`x-call` value), the action for each attempt; past the end of a
/// call's list (or for a call not listed) the default action applies
/// ([`HttpAction::Ok`] unless set with [`HttpScript::otherwise`] or
/// [`HttpScript::always`]).
#[derive(Clone, Debug)]
pub struct HttpScript {
    calls: HashMap<String, Vec<HttpAction>>,
    default: HttpAction,
}

impl Default for HttpScript {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpScript {
    /// Every request answers 200 with its body echoed.
    pub fn new() -> Self {
        Self {
            calls: HashMap::new(),
            default: HttpAction::Ok,
        }
    }

    /// Every request of every call does `action`.
    pub fn always(action: HttpAction) -> Self {
        Self::new().otherwise(action)
    }

    /// Scripts the attempts of `call`, in order (replacing an earlier script
    /// for it).
    pub fn call(
        mut self,
        call: impl Into<String>,
        attempts: impl IntoIterator<Item = HttpAction>,
    ) -> Self {
        self.calls
            .insert(call.into(), attempts.into_iter().collect());
        self
    }

    /// The action for attempts no call script covers.
    pub fn otherwise(mut self, action: HttpAction) -> Self {
        self.default = action;
        self
    }

    /// The action for attempt `attempt` (zero-based) of `call`.
    pub fn action(&self, call: &str, attempt: usize) -> HttpAction {
        self.calls
            .get(call)
            .and_then(|attempts| attempts.get(attempt))
            .unwrap_or(&self.default)
            .clone()
    }
}

/// What the HTTP peer did with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpOutcome {
    /// Answered with this status (200 for [`HttpAction::Ok`]).
    Status(u16),
    /// Failed the exchange without an answer ([`HttpAction::Abort`]).
    Aborted,
    /// A [`HttpAction::Hang`] released by the peer's shutdown (answered 503).
    ShutDown,
}

/// One request as the HTTP peer saw it.
#[derive(Clone, Debug)]
pub struct HttpAttemptRecord {
    /// The `x-call` header value (`"0"` when absent).
    pub call: String,
    /// Zero-based attempt index: requests of this call seen before this one.
    pub attempt: usize,
    /// Request method.
    pub method: Method,
    /// Request path and query.
    pub path: String,
    /// HTTP version the request came in on.
    pub version: Version,
    /// All request headers.
    pub headers: HeaderMap,
    /// The `grpc-previous-rpc-attempts` header, as sent.
    pub previous_attempts: Option<String>,
    /// The request body bytes received so far, exactly.
    pub body: Bytes,
    /// Whether the body reached its end.
    pub body_complete: bool,
    /// Request trailers, if any were sent.
    pub trailers: Option<HeaderMap>,
    /// When the request head arrived.
    pub arrived: Instant,
    /// When the peer answered or the request was cancelled.
    pub ended: Option<Instant>,
    /// The client went away before the peer answered (the handler was dropped
    /// or the body broke off).
    pub cancelled: bool,
    /// What the peer did, if it got that far.
    pub outcome: Option<HttpOutcome>,
}

impl HttpAttemptRecord {
    /// A request header as a string, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Attempt for HttpAttemptRecord {
    type Call = String;

    fn call(&self) -> &String {
        &self.call
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled
    }

    fn mark_cancelled(&mut self, at: Instant) {
        self.cancelled = true;
        self.ended = Some(at);
    }
}

struct Shared {
    script: HttpScript,
    recorder: Recorder<HttpAttemptRecord>,
    // `true` releases every `Hang`, so that graceful shutdown can finish.
    released: watch::Sender<bool>,
}

/// A running HTTP peer. Stop it with [`HttpPeer::shutdown`]; dropping it only
/// signals the shutdown.
#[derive(Debug)]
pub struct HttpPeer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("script", &self.script)
            .finish_non_exhaustive()
    }
}

impl HttpPeer {
    /// The address the peer listens on (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port{path}`; `path` must start with `/`.
    pub fn url(&self, path: &str) -> Uri {
        format!("http://{}{path}", self.addr)
            .parse()
            .expect("peer url from a path starting with '/'")
    }

    /// What the peer saw.
    pub fn recorder(&self) -> Recorder<HttpAttemptRecord> {
        self.shared.recorder.clone()
    }

    /// Ends hanging requests, stops accepting, shuts every connection down
    /// gracefully and waits for their tasks and the server task. Panics if the
    /// server task panicked.
    pub async fn shutdown(mut self) {
        self.shared.released.send_replace(true);
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
        if let Some(server) = self.server.take()
            && let Err(error) = server.await
        {
            panic!("http peer task failed: {error}");
        }
    }
}

impl Drop for HttpPeer {
    fn drop(&mut self) {
        self.shared.released.send_replace(true);
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
    }
}

/// Serves `script` over HTTP/1.1 and HTTP/2 on `127.0.0.1:0`.
pub async fn spawn_http(script: HttpScript) -> HttpPeer {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("listener address");
    let shared = Arc::new(Shared {
        script,
        recorder: Recorder::new(),
        released: watch::Sender::new(false),
    });
    let (shutdown, signal) = oneshot::channel();
    let server = tokio::spawn(serve(listener, Arc::clone(&shared), signal));
    HttpPeer {
        addr,
        shared,
        shutdown: Some(shutdown),
        server: Some(server),
    }
}

/// Accepts connections until `signal` fires (or its sender is dropped), then
/// shuts the open ones down gracefully and waits for them.
async fn serve(listener: TcpListener, shared: Arc<Shared>, mut signal: oneshot::Receiver<()>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut signal => break,
            accepted = listener.accept() => {
                // A failed accept (e.g. the client gave up) only loses that connection.
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let shared = Arc::clone(&shared);
                let service = service_fn(move |request| handle(Arc::clone(&shared), request));
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                let mut stopped = stopped.clone();
                connections.spawn(async move {
                    let mut connection = pin!(connection);
                    tokio::select! {
                        // Connection errors (client resets, aborts) are part of the tests.
                        _ = connection.as_mut() => return,
                        _ = stopped.wait_for(|stop| *stop) => connection.as_mut().graceful_shutdown(),
                    }
                    let _ = connection.await;
                });
            }
            // Reap finished connections so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    stop.send_replace(true);
    while let Some(joined) = connections.join_next().await {
        if let Err(error) = joined
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
    }
}

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let (parts, mut body) = request.into_parts();
    let call = parts.headers.get(CALL_HEADER).map_or_else(
        || "0".to_owned(),
        |v| String::from_utf8_lossy(v.as_bytes()).into_owned(),
    );
    let previous_attempts = parts
        .headers
        .get("grpc-previous-rpc-attempts")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let arrived = Instant::now();
    let guard = shared.recorder.begin(&call, |attempt| HttpAttemptRecord {
        call: call.clone(),
        attempt,
        method: parts.method.clone(),
        path,
        version: parts.version,
        headers: parts.headers.clone(),
        previous_attempts,
        body: Bytes::new(),
        body_complete: false,
        trailers: None,
        arrived,
        ended: None,
        cancelled: false,
        outcome: None,
    });

    // Record frame by frame, so that a request cut short shows what did arrive.
    let mut received = BytesMut::new();
    while let Some(frame) = body.frame().await {
        // The client went away mid-body: the guard records a cancellation.
        let frame = frame?;
        match frame.into_data() {
            Ok(data) => {
                received.extend_from_slice(&data);
                let so_far = Bytes::copy_from_slice(&received);
                guard.update(|record| record.body = so_far);
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    guard.update(|record| record.trailers = Some(trailers));
                }
            }
        }
    }
    guard.update(|record| record.body_complete = true);

    let action = shared.script.action(&call, guard.attempt());
    let attempt = guard.attempt();
    let Some(action) = resolve(&shared, action).await else {
        finish(guard, HttpOutcome::ShutDown);
        return Ok(response(
            StatusCode::SERVICE_UNAVAILABLE,
            &call,
            attempt,
            Bytes::new(),
        ));
    };
    match action {
        HttpAction::Ok => {
            finish(guard, HttpOutcome::Status(200));
            Ok(response(StatusCode::OK, &call, attempt, received.freeze()))
        }
        HttpAction::Status { status, headers } => {
            let Ok(status) = StatusCode::from_u16(status) else {
                finish(guard, HttpOutcome::Status(500));
                let why = format!("script error: invalid status {status}");
                return Ok(response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &call,
                    attempt,
                    why.into(),
                ));
            };
            let mut answer = response(status, &call, attempt, Bytes::new());
            for (name, value) in headers {
                let (Ok(name), Ok(value)) = (
                    HeaderName::try_from(name.as_str()),
                    HeaderValue::try_from(value.as_str()),
                ) else {
                    finish(guard, HttpOutcome::Status(500));
                    let why = format!("script error: invalid header {name:?}: {value:?}");
                    return Ok(response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &call,
                        attempt,
                        why.into(),
                    ));
                };
                answer.headers_mut().append(name, value);
            }
            finish(guard, HttpOutcome::Status(status.as_u16()));
            Ok(answer)
        }
        HttpAction::Abort => {
            finish(guard, HttpOutcome::Aborted);
            Err("scripted abort".into())
        }
        // `resolve` never returns these.
        HttpAction::Delay(..) | HttpAction::Hang => Err("unresolved action".into()),
    }
}

/// Runs the delays of `action` and resolves what is left to answer with.
/// `None`: the hang was released by shutdown.
async fn resolve(shared: &Shared, mut action: HttpAction) -> Option<HttpAction> {
    loop {
        match action {
            HttpAction::Delay(delay, then) => {
                tokio::time::sleep(delay).await;
                action = *then;
            }
            HttpAction::Hang => {
                let mut released = shared.released.subscribe();
                // An error means the sender is gone, which `shared` prevents.
                let _ = released.wait_for(|released| *released).await;
                return None;
            }
            other => return Some(other),
        }
    }
}

fn finish(guard: AttemptGuard<HttpAttemptRecord>, outcome: HttpOutcome) {
    let now = Instant::now();
    guard.finish(|record| {
        record.outcome = Some(outcome);
        record.ended = Some(now);
    });
}

fn response(status: StatusCode, call: &str, attempt: usize, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Ok(call) = HeaderValue::try_from(call) {
        headers.insert(PEER_CALL_HEADER, call);
    }
    headers.insert(PEER_ATTEMPT_HEADER, HeaderValue::from(attempt));
    response
}

/// A hyper-util legacy client for HTTP/1.1 (nodelay, no TLS).
pub fn http_client<B>() -> Client<HttpConnector, B>
where
    B: Body + Send,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new()).build(connector())
}

/// A hyper-util legacy client speaking HTTP/2 with prior knowledge.
pub fn http2_client<B>() -> Client<HttpConnector, B>
where
    B: Body + Send,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector())
}

fn connector() -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector
}
