//! A scriptable gRPC peer: the `test.echo.Echo` and `test.echo.BidiEcho`
//! services served by tonic, which answer each attempt of each call as a
//! [`Script`] says and record what they saw in a [`Recorder`].
//!
//! ```ignore
//! let peer = spawn_grpc(Script::new().call(0, [Action::fail(Code::Unavailable), Action::Ok])).await;
//! let mut client = EchoClient::new(grpc_channel(peer.addr()).await);
//! // ... call 0: the first attempt fails with UNAVAILABLE, the second succeeds.
//! assert_eq!(peer.recorder().attempt_count(0), 2);
//! peer.shutdown().await;
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::server::Router;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status, Streaming};

use super::pb::bidi_echo_server::{BidiEcho, BidiEchoServer};
use super::pb::echo_server::{Echo, EchoServer};
use super::pb::{Chunk, Digest, EchoReply, EchoRequest};
use super::{Attempt, AttemptGuard, Recorder};

/// Request metadata key naming the call of a `ClientStream` request (a
/// decimal `u32`; absent means call 0).
pub const CALL_METADATA: &str = "x-call";

/// Trailing metadata key carrying a scripted pushback.
pub const PUSHBACK_METADATA: &str = "grpc-retry-pushback-ms";

/// How many replies a `ServerStream` attempt scripted [`Action::Ok`] sends.
pub const SERVER_STREAM_REPLIES: usize = 3;

/// What the peer does with one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Answer: an echo of the request (`Unary`), a digest of the chunks
    /// (`ClientStream`), [`SERVER_STREAM_REPLIES`] echoes (`ServerStream`), or
    /// (`Bidi`) response headers once the first chunk has arrived, then an
    /// echo of every chunk as it arrives, and OK when the request stream ends.
    Ok,
    /// Answer with a Trailers-Only error `code`; `pushback`, if any, is the raw
    /// `grpc-retry-pushback-ms` value sent with it.
    Fail {
        /// The status code.
        code: Code,
        /// Raw `grpc-retry-pushback-ms` value, sent verbatim.
        pushback: Option<String>,
    },
    /// Wait (on the tokio clock), then do the next action.
    Delay(Duration, Box<Action>),
    /// Never answer. The attempt stays open until the client cancels it, its
    /// `grpc-timeout` expires (tonic's server enforces it), or the peer shuts
    /// down (then it ends with UNAVAILABLE and [`Outcome::ShutDown`]).
    Hang,
    /// `ServerStream`: send response headers and one echo, then fail with this
    /// code in the trailers, so the call is committed (`Bidi`: echo every
    /// chunk as [`Action::Ok`] does, then fail). `Unary` and `ClientStream`
    /// cannot answer in two steps; for them this is a plain [`Action::Fail`]
    /// without pushback.
    FailAfterHeaders(Code),
    /// Answer with a Trailers-Only error `code` whose details (built with
    /// tonic-types, sent in `grpc-status-details-bin`) hold a
    /// `google.rpc.RetryInfo` with this `retry_delay`.
    FailWithRetryInfo {
        /// The status code.
        code: Code,
        /// The `RetryInfo`'s delay.
        delay: Duration,
    },
}

impl Action {
    /// Fail with `code`, no pushback.
    pub fn fail(code: Code) -> Self {
        Self::Fail {
            code,
            pushback: None,
        }
    }

    /// Fail with `code` and the raw pushback value `ms` (sent verbatim, so
    /// invalid values such as `"-1"` or `"soon"` can be tested too).
    pub fn pushback(code: Code, ms: impl Into<String>) -> Self {
        Self::Fail {
            code,
            pushback: Some(ms.into()),
        }
    }

    /// Fail with `code` and a `google.rpc.RetryInfo` of `delay`.
    pub fn retry_info(code: Code, delay: Duration) -> Self {
        Self::FailWithRetryInfo { code, delay }
    }

    /// Wait `delay`, then do `then`.
    pub fn delay(delay: Duration, then: Action) -> Self {
        Self::Delay(delay, Box::new(then))
    }
}

/// Per call, the action for each attempt; past the end of a call's list (or
/// for a call not listed) the default action applies ([`Action::Ok`] unless
/// set with [`Script::otherwise`] or [`Script::always`]).
///
/// ```ignore
/// Script::new()
///     .call(0, [Action::fail(Code::Unavailable), Action::Ok])
///     .call(1, [Action::pushback(Code::Unavailable, "50")])
///     .otherwise(Action::fail(Code::Internal));
/// ```
#[derive(Clone, Debug)]
pub struct Script {
    calls: HashMap<u32, Vec<Action>>,
    default: Action,
}

impl Default for Script {
    fn default() -> Self {
        Self::new()
    }
}

impl Script {
    /// Every attempt answers OK.
    pub fn new() -> Self {
        Self {
            calls: HashMap::new(),
            default: Action::Ok,
        }
    }

    /// Every attempt of every call does `action`.
    pub fn always(action: Action) -> Self {
        Self::new().otherwise(action)
    }

    /// Scripts the attempts of `call`, in order (replacing an earlier script
    /// for it).
    pub fn call(mut self, call: u32, attempts: impl IntoIterator<Item = Action>) -> Self {
        self.calls.insert(call, attempts.into_iter().collect());
        self
    }

    /// The action for attempts no call script covers.
    pub fn otherwise(mut self, action: Action) -> Self {
        self.default = action;
        self
    }

    /// The action for attempt `attempt` (zero-based) of `call`.
    pub fn action(&self, call: u32, attempt: usize) -> Action {
        self.calls
            .get(&call)
            .and_then(|attempts| attempts.get(attempt))
            .unwrap_or(&self.default)
            .clone()
    }
}

/// Which RPC of the `Echo` service an attempt called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `/test.echo.Echo/Unary`
    Unary,
    /// `/test.echo.Echo/ClientStream`
    ClientStream,
    /// `/test.echo.Echo/ServerStream`
    ServerStream,
    /// `/test.echo.BidiEcho/Bidi`
    Bidi,
}

/// What the peer sent back for an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A successful answer.
    Ok,
    /// A Trailers-Only error, with the raw pushback value if one was sent.
    Status {
        /// The status code.
        code: Code,
        /// Raw `grpc-retry-pushback-ms` value.
        pushback: Option<String>,
    },
    /// `ServerStream`: headers and one message, then this code in trailers.
    MessageThenStatus(Code),
    /// A [`Action::Hang`] released by the peer's shutdown (UNAVAILABLE).
    ShutDown,
}

/// One attempt as the gRPC peer saw it.
#[derive(Clone, Debug)]
pub struct AttemptRecord {
    /// The call: the request's `call` field (`Unary`, `ServerStream`) or the
    /// `x-call` metadata (`ClientStream`).
    pub call: u32,
    /// Zero-based attempt index: attempts of this call seen before this one.
    pub attempt: usize,
    /// The RPC called.
    pub method: Method,
    /// The `grpc-previous-rpc-attempts` header, as sent.
    pub previous_attempts: Option<String>,
    /// The `grpc-timeout` header, as sent.
    pub grpc_timeout: Option<String>,
    /// All request metadata (headers).
    pub metadata: MetadataMap,
    /// The request's `message` field (empty for `ClientStream`).
    pub message: String,
    /// The request's `payload` field; for `ClientStream` every chunk's bytes
    /// concatenated, as received so far.
    pub payload: Bytes,
    /// Request messages received (1 for `Unary` and `ServerStream`).
    pub messages: usize,
    /// When the attempt reached the handler.
    pub arrived: Instant,
    /// When the handler answered or was cancelled.
    pub ended: Option<Instant>,
    /// The client went away before the handler answered: the handler was
    /// dropped (client cancel, or tonic enforcing `grpc-timeout`), or the
    /// request stream broke off.
    pub cancelled: bool,
    /// What the handler answered, if it did.
    pub outcome: Option<Outcome>,
}

impl Attempt for AttemptRecord {
    type Call = u32;

    fn call(&self) -> &u32 {
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

/// The scripted `Echo` implementation. Mount it on any server with
/// [`FaultEcho::into_server`]; [`spawn_grpc`] does that on a fresh listener.
#[derive(Clone, Debug)]
pub struct FaultEcho {
    script: Arc<Script>,
    recorder: Recorder,
    // `true` releases every `Hang`, so that graceful shutdown can finish.
    released: Arc<watch::Sender<bool>>,
}

impl FaultEcho {
    /// A service following `script`, with a fresh recorder.
    pub fn new(script: Script) -> Self {
        Self {
            script: Arc::new(script),
            recorder: Recorder::new(),
            released: Arc::new(watch::Sender::new(false)),
        }
    }

    /// The recorder this service writes to.
    pub fn recorder(&self) -> Recorder {
        self.recorder.clone()
    }

    /// Ends every hanging attempt, now and from now on, with UNAVAILABLE.
    pub fn release_hangs(&self) {
        self.released.send_replace(true);
    }

    /// The tonic service, ready for `Server::builder().add_service(..)`.
    pub fn into_server(self) -> EchoServer<Self> {
        EchoServer::new(self)
    }

    /// Runs the delays of `action` and resolves what is left to answer with.
    /// `None`: the hang was released by shutdown.
    async fn resolve(&self, mut action: Action) -> Option<Action> {
        loop {
            match action {
                Action::Delay(delay, then) => {
                    tokio::time::sleep(delay).await;
                    action = *then;
                }
                Action::Hang => {
                    let mut released = self.released.subscribe();
                    // An error means the sender is gone, which `self` prevents.
                    let _ = released.wait_for(|released| *released).await;
                    return None;
                }
                other => return Some(other),
            }
        }
    }
}

/// Records a new attempt of `call` that has just reached a handler, with what `metadata`
/// says of it; the guard marks it cancelled if the handler is dropped before it finishes.
fn begin_attempt(
    recorder: &Recorder,
    call: u32,
    method: Method,
    metadata: &MetadataMap,
    message: String,
    payload: Bytes,
    messages: usize,
) -> AttemptGuard<AttemptRecord> {
    let header = |name: &str| {
        metadata
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_encoded_bytes()).into_owned())
    };
    let previous_attempts = header("grpc-previous-rpc-attempts");
    let grpc_timeout = header("grpc-timeout");
    let arrived = Instant::now();
    recorder.begin(&call, |attempt| AttemptRecord {
        call,
        attempt,
        method,
        previous_attempts,
        grpc_timeout,
        metadata: metadata.clone(),
        message,
        payload,
        messages,
        arrived,
        ended: None,
        cancelled: false,
        outcome: None,
    })
}

/// The status for a scripted failure; an unsendable pushback value becomes
/// INTERNAL so a broken script cannot pass silently.
fn failure(code: Code, pushback: Option<&str>) -> Status {
    let mut metadata = MetadataMap::new();
    if let Some(raw) = pushback {
        match AsciiMetadataValue::try_from(raw) {
            Ok(value) => {
                metadata.insert(PUSHBACK_METADATA, value);
            }
            Err(_) => {
                return Status::internal(format!(
                    "script error: pushback {raw:?} is not a header value"
                ));
            }
        }
    }
    Status::with_metadata(code, "scripted failure", metadata)
}

/// The status for a scripted failure carrying a `RetryInfo`, as a Google API sends it.
fn failure_with_retry_info(code: Code, delay: Duration) -> Status {
    use tonic_types::{ErrorDetails, StatusExt as _};
    Status::with_error_details(
        code,
        "scripted failure",
        ErrorDetails::with_retry_info(Some(delay)),
    )
}

fn shut_down() -> Status {
    Status::unavailable("peer shutting down")
}

fn finish_with(guard: AttemptGuard<AttemptRecord>, outcome: Outcome) {
    let now = Instant::now();
    guard.finish(|record| {
        record.outcome = Some(outcome);
        record.ended = Some(now);
    });
}

/// Ends a single-answer attempt (`Unary`, `ClientStream`) as `action` says;
/// `ok` builds the successful answer.
fn answer<T>(
    guard: AttemptGuard<AttemptRecord>,
    action: Option<Action>,
    ok: impl FnOnce() -> T,
) -> Result<Response<T>, Status> {
    match action {
        None => {
            finish_with(guard, Outcome::ShutDown);
            Err(shut_down())
        }
        Some(Action::Ok) => {
            finish_with(guard, Outcome::Ok);
            Ok(Response::new(ok()))
        }
        Some(Action::Fail { code, pushback }) => {
            let status = failure(code, pushback.as_deref());
            finish_with(guard, Outcome::Status { code, pushback });
            Err(status)
        }
        Some(Action::FailWithRetryInfo { code, delay }) => {
            finish_with(
                guard,
                Outcome::Status {
                    code,
                    pushback: None,
                },
            );
            Err(failure_with_retry_info(code, delay))
        }
        // One answer cannot carry headers and then an error: fail plainly.
        Some(Action::FailAfterHeaders(code)) => {
            finish_with(
                guard,
                Outcome::Status {
                    code,
                    pushback: None,
                },
            );
            Err(failure(code, None))
        }
        // `resolve` never returns these.
        Some(Action::Delay(..) | Action::Hang) => Err(Status::internal("unresolved action")),
    }
}

/// The call a streaming request belongs to: its [`CALL_METADATA`] (absent: 0).
fn call_of(metadata: &MetadataMap) -> Result<u32, Status> {
    match metadata.get(CALL_METADATA) {
        None => Ok(0),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .ok_or_else(|| Status::invalid_argument("x-call must be a decimal u32")),
    }
}

/// Adds a received chunk to what the record of a streaming attempt shows.
fn record_chunk(guard: &AttemptGuard<AttemptRecord>, received: &mut BytesMut, chunk: &Chunk) {
    received.extend_from_slice(&chunk.data);
    let payload = Bytes::copy_from_slice(received);
    guard.update(|record| {
        record.payload = payload;
        record.messages = record.messages.saturating_add(1);
    });
}

fn attempt_u32(attempt: usize) -> u32 {
    u32::try_from(attempt).unwrap_or(u32::MAX)
}

/// The `ServerStream` response stream.
pub type ReplyStream = tokio_stream::Iter<std::vec::IntoIter<Result<EchoReply, Status>>>;

#[tonic::async_trait]
impl Echo for FaultEcho {
    async fn unary(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let metadata = request.metadata().clone();
        let req = request.into_inner();
        let guard = begin_attempt(
            &self.recorder,
            req.call,
            Method::Unary,
            &metadata,
            req.message.clone(),
            Bytes::from(req.payload.clone()),
            1,
        );
        let attempt = attempt_u32(guard.attempt());
        let action = self
            .resolve(self.script.action(req.call, guard.attempt()))
            .await;
        answer(guard, action, || EchoReply {
            message: req.message,
            payload: req.payload,
            attempt,
        })
    }

    async fn client_stream(
        &self,
        request: Request<Streaming<Chunk>>,
    ) -> Result<Response<Digest>, Status> {
        let metadata = request.metadata().clone();
        let call = call_of(&metadata)?;
        let mut stream = request.into_inner();
        let guard = begin_attempt(
            &self.recorder,
            call,
            Method::ClientStream,
            &metadata,
            String::new(),
            Bytes::new(),
            0,
        );
        // Record chunk by chunk, so that an attempt cut short shows what did arrive.
        let mut received = BytesMut::new();
        let mut chunks: u64 = 0;
        loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    record_chunk(&guard, &mut received, &chunk);
                    chunks = chunks.saturating_add(1);
                }
                Ok(None) => break,
                // The client went away mid-stream: the guard records a cancellation.
                Err(status) => return Err(status),
            }
        }
        let action = self
            .resolve(self.script.action(call, guard.attempt()))
            .await;
        answer(guard, action, || Digest {
            bytes: u64::try_from(received.len()).unwrap_or(u64::MAX),
            chunks,
            sha_or_all: received.to_vec(),
        })
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(
        &self,
        request: Request<EchoRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let metadata = request.metadata().clone();
        let req = request.into_inner();
        let guard = begin_attempt(
            &self.recorder,
            req.call,
            Method::ServerStream,
            &metadata,
            req.message.clone(),
            Bytes::from(req.payload.clone()),
            1,
        );
        let reply = EchoReply {
            message: req.message,
            payload: req.payload,
            attempt: attempt_u32(guard.attempt()),
        };
        let action = self.script.action(req.call, guard.attempt());
        match self.resolve(action).await {
            None => {
                finish_with(guard, Outcome::ShutDown);
                Err(shut_down())
            }
            Some(Action::Ok) => {
                finish_with(guard, Outcome::Ok);
                let replies = vec![Ok(reply); SERVER_STREAM_REPLIES];
                Ok(Response::new(tokio_stream::iter(replies)))
            }
            Some(Action::Fail { code, pushback }) => {
                let status = failure(code, pushback.as_deref());
                finish_with(guard, Outcome::Status { code, pushback });
                Err(status)
            }
            Some(Action::FailWithRetryInfo { code, delay }) => {
                finish_with(
                    guard,
                    Outcome::Status {
                        code,
                        pushback: None,
                    },
                );
                Err(failure_with_retry_info(code, delay))
            }
            Some(Action::FailAfterHeaders(code)) => {
                finish_with(guard, Outcome::MessageThenStatus(code));
                let replies = vec![Ok(reply), Err(failure(code, None))];
                Ok(Response::new(tokio_stream::iter(replies)))
            }
            Some(Action::Delay(..) | Action::Hang) => Err(Status::internal("unresolved action")),
        }
    }
}

/// The `Bidi` response stream: the echoes, sent by the task that reads the
/// request stream.
pub type ChunkStream = ReceiverStream<Result<Chunk, Status>>;

#[tonic::async_trait]
impl BidiEcho for FaultEcho {
    type BidiStream = ChunkStream;

    async fn bidi(
        &self,
        request: Request<Streaming<Chunk>>,
    ) -> Result<Response<ChunkStream>, Status> {
        let attempt = BidiAttempt::begin(&self.recorder, request).await?;
        let end = match self
            .resolve(self.script.action(attempt.call, attempt.guard.attempt()))
            .await
        {
            Some(Action::Ok) => None,
            Some(Action::FailAfterHeaders(code)) => Some(code),
            // The other actions answer at once, Trailers-Only.
            other => {
                return answer(attempt.guard, other, || {
                    ReceiverStream::new(mpsc::channel(1).1)
                });
            }
        };
        Ok(Response::new(attempt.echo(end)))
    }
}

/// A `Bidi` attempt in its handler, its first chunk in: what the scripted peer does with
/// every `Bidi` attempt before its script decides the answer, for a test's own handler that
/// records its attempts as the scripted peer does.
pub(crate) struct BidiAttempt {
    /// The call ([`CALL_METADATA`]).
    pub(crate) call: u32,
    /// The request metadata.
    pub(crate) metadata: MetadataMap,
    /// The attempt's record.
    pub(crate) guard: AttemptGuard<AttemptRecord>,
    first: Option<Chunk>,
    stream: Streaming<Chunk>,
    received: BytesMut,
}

impl BidiAttempt {
    /// Records the attempt in `recorder` and waits for its first chunk.
    pub(crate) async fn begin(
        recorder: &Recorder,
        request: Request<Streaming<Chunk>>,
    ) -> Result<BidiAttempt, Status> {
        let metadata = request.metadata().clone();
        let call = call_of(&metadata)?;
        let mut stream = request.into_inner();
        let guard = begin_attempt(
            recorder,
            call,
            Method::Bidi,
            &metadata,
            String::new(),
            Bytes::new(),
            0,
        );
        let mut received = BytesMut::new();
        // The client went away before its first chunk: the guard records a cancellation.
        let first = stream.message().await?;
        if let Some(chunk) = &first {
            record_chunk(&guard, &mut received, chunk);
        }
        Ok(BidiAttempt {
            call,
            metadata,
            guard,
            first,
            stream,
            received,
        })
    }

    /// The rest of the attempt, on a task of its own: echoes the first chunk and then every
    /// chunk as it arrives, recording each; when the request stream ends, finishes the
    /// attempt OK, or, with `end`, sends that code after the echoes
    /// ([`Action::FailAfterHeaders`]). The attempt counts as cancelled if the client drops
    /// the response or the request stream breaks off.
    pub(crate) fn echo(self, end: Option<Code>) -> ChunkStream {
        let BidiAttempt {
            guard,
            first,
            mut stream,
            mut received,
            ..
        } = self;
        let (echoes, replies) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut next = first;
            while let Some(chunk) = next {
                if echoes.send(Ok(chunk)).await.is_err() {
                    // The client dropped the response: the guard records a cancellation.
                    return;
                }
                next = match stream.message().await {
                    Ok(Some(chunk)) => {
                        record_chunk(&guard, &mut received, &chunk);
                        Some(chunk)
                    }
                    Ok(None) => None,
                    // The request stream broke off: the guard records a cancellation.
                    Err(_) => return,
                };
            }
            match end {
                None => finish_with(guard, Outcome::Ok),
                Some(code) => {
                    finish_with(guard, Outcome::MessageThenStatus(code));
                    let _ = echoes.send(Err(failure(code, None))).await;
                }
            }
        });
        ReceiverStream::new(replies)
    }
}

/// A tonic server on `127.0.0.1:0` whose connections have `TCP_NODELAY`. Stop it with
/// [`ServerTask::shutdown`]; dropping it only signals the shutdown.
#[derive(Debug)]
pub struct ServerTask {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl ServerTask {
    /// Serves `router` (`Server::builder()`, configured, with its services added).
    pub async fn spawn(router: Router) -> ServerTask {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        // tonic ignores its own nodelay setting for a custom incoming stream.
        let incoming = TcpListenerStream::new(listener).map(|conn| {
            conn.and_then(|stream| {
                stream.set_nodelay(true)?;
                Ok(stream)
            })
        });
        let (shutdown, signal) = oneshot::channel::<()>();
        let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            // A dropped sender also means shut down.
            let _ = signal.await;
        }));
        ServerTask {
            addr,
            shutdown: Some(shutdown),
            server: Some(server),
        }
    }

    /// The address the server listens on (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, waits for open connections to close gracefully and for the server
    /// task to end. Panics if the server failed, so a broken peer fails the test.
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
        if let Some(server) = self.server.take() {
            match server.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => panic!("grpc peer failed: {error}"),
                Err(error) => panic!("grpc peer task failed: {error}"),
            }
        }
    }
}

impl Drop for ServerTask {
    fn drop(&mut self) {
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
    }
}

/// A running gRPC peer. Stop it with [`GrpcPeer::shutdown`]; dropping it
/// only signals the shutdown.
#[derive(Debug)]
pub struct GrpcPeer {
    service: FaultEcho,
    server: ServerTask,
}

impl GrpcPeer {
    /// The address the peer listens on (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:port`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// What the peer saw.
    pub fn recorder(&self) -> Recorder {
        self.service.recorder()
    }

    /// The `grpc-previous-rpc-attempts` each attempt of `call` carried, in order.
    pub fn previous_attempts(&self, call: u32) -> Vec<Option<String>> {
        self.recorder()
            .attempts(call)
            .into_iter()
            .map(|a| a.previous_attempts)
            .collect()
    }

    /// A new channel to the peer.
    pub async fn channel(&self) -> Channel {
        grpc_channel(self.addr()).await
    }

    /// Ends hanging attempts, then shuts the server down as [`ServerTask::shutdown`] does.
    pub async fn shutdown(mut self) {
        self.service.release_hangs();
        self.server.stop().await;
    }
}

impl Drop for GrpcPeer {
    fn drop(&mut self) {
        // The server is signalled next, when it is dropped.
        self.service.release_hangs();
    }
}

/// `[None, Some("1"), .., Some("n-1")]`: the `grpc-previous-rpc-attempts` that `n` attempts
/// of one call must carry.
pub fn expected_previous(n: usize) -> Vec<Option<String>> {
    (0..n).map(|i| (i > 0).then(|| i.to_string())).collect()
}

/// Serves [`FaultEcho`] following `script` on `127.0.0.1:0`.
pub async fn spawn_grpc(script: Script) -> GrpcPeer {
    spawn_grpc_on(Server::builder(), script).await
}

/// [`spawn_grpc`] on a server the caller has configured (HTTP/2 limits, timeouts).
pub async fn spawn_grpc_on(mut server: Server, script: Script) -> GrpcPeer {
    let service = FaultEcho::new(script);
    let router = server
        .add_service(service.clone().into_server())
        .add_service(BidiEchoServer::new(service.clone()));
    GrpcPeer {
        server: ServerTask::spawn(router).await,
        service,
    }
}

/// A `ClientStream` or `Bidi` request of call `call` (its [`CALL_METADATA`]) whose stream is
/// fed, chunk by chunk, through the returned sender.
pub fn fed_request(call: u32) -> (mpsc::Sender<Chunk>, Request<ReceiverStream<Chunk>>) {
    let (sender, receiver) = mpsc::channel(4);
    let mut request = Request::new(ReceiverStream::new(receiver));
    request
        .metadata_mut()
        .insert(CALL_METADATA, AsciiMetadataValue::from(call));
    (sender, request)
}

/// A connected channel to `http://{addr}`. Panics if it cannot connect.
pub async fn grpc_channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid endpoint uri")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect to grpc peer")
}
